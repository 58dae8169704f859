"""Data-parallel training under torchrun (docs/scaling.md): the process group and the few collectives mixit needs.

`setup` reads what torchrun sets for each process (RANK, WORLD_SIZE, LOCAL_RANK), joins the process group (nccl on
GPUs, gloo on CPUs) and returns a `Dist`; without those variables it returns the one-process `Dist`, for which every
helper here does nothing, so the training loop has one code path.

Who says why a job stops (docs/reliability.md, "Distributed runs"): every process, a malformed environment
(`env_world`); rank 0, another refusal (`refusal_said`); the process that met it, a fault of the machine
(`fault_said`).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as td

from mixit.errors import UsageError


@dataclass(frozen=True)
class Dist:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """The process that writes the run directory and prints."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


class BadEnvironment(UsageError):
    """The distributed environment variables are malformed or incomplete: every process says so."""


TORCHRUN_SETS = "torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for each process"
MAX_PORT = 65535


def _env_int(name: str, low: int, high: int | None = None) -> int:
    """The integer in environment variable `name`, in [low, high] (no upper bound if `high` is None)."""
    text = os.environ[name]
    try:
        value = int(text)
        if value >= low and (high is None or value <= high):
            return value
    except ValueError:
        pass
    allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
    raise BadEnvironment(f"environment variable {name} must be an integer {allowed}, got {text!r} ({TORCHRUN_SETS})")


def _listed(names: list[str]) -> str:
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def env_world() -> Dist:
    """The job as torchrun (or Slurm through submitit) sets it in the environment: one process when none of RANK,
    WORLD_SIZE and LOCAL_RANK is set; else all three, integers in range, and with more than one process MASTER_ADDR
    and MASTER_PORT too. BadEnvironment names the first variable that is wrong."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    given = [name for name in names if name in os.environ]
    if not given:
        return Dist()
    for name in given:
        _env_int(name, 1 if name == "WORLD_SIZE" else 0)
    missing = [name for name in names if name not in given]
    if "WORLD_SIZE" in given and int(os.environ["WORLD_SIZE"]) > 1:
        missing += [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name, "").strip()]
    if missing:
        raise BadEnvironment(
            f"environment variable{'s' * (len(missing) > 1)} {_listed(missing)} not set, "
            f"but {_listed(given)} {'is' if len(given) == 1 else 'are'} ({TORCHRUN_SETS})"
        )
    world = _env_int("WORLD_SIZE", 1)
    dist = Dist(_env_int("RANK", 0, world - 1), world, _env_int("LOCAL_RANK", 0, world - 1))
    if dist.active:
        _env_int("MASTER_PORT", 1, MAX_PORT)
    return dist


def setup(device: torch.device) -> tuple[Dist, torch.device]:
    """Join the process group of a torchrun job (if this is one) and return it with this process's device."""
    dist = env_world()
    if not dist.active:
        return dist, device
    if device.type == "cuda":
        if dist.local_rank >= torch.cuda.device_count():
            raise BadEnvironment(
                f"environment variable LOCAL_RANK is {dist.local_rank}, but this machine has "
                f"{torch.cuda.device_count()} GPU(s); start at most one process per GPU ({TORCHRUN_SETS})"
            )
        device = torch.device("cuda", dist.local_rank)
        torch.cuda.set_device(device)
    if not td.is_initialized():
        td.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist, device


REFUSAL_WAIT = datetime.timedelta(seconds=60)
"""How long a rank other than 0 waits for rank 0 to say why the job is refused (rank 0 exiting ends it sooner)."""


def _agent_store(dist: Dist) -> td.TCPStore | None:
    """torchrun's own store (TORCHELASTIC_USE_AGENT_STORE), which outlives the processes it started; None outside
    a torchrun job of several processes. RuntimeError if it is gone (torchrun is stopping the job)."""
    if not dist.active or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return td.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=REFUSAL_WAIT)


def _key(what: str) -> str:
    return f"mixit/{what}-said/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def refusal_said(dist: Dist) -> None:
    """After a refusal, before exiting under torchrun: rank 0 has printed why, and posts that in torchrun's store;
    another rank waits for the post, then for torchrun to stop it, and leaves with exit status 2 either way. Rank 0
    must exit first: a rank exiting before it could have torchrun stop it before its line is out (or end it with
    SIGTERM, status -15). Elsewhere this does nothing."""
    try:
        store = _agent_store(dist)
        if store is None:
            return
        if dist.main:
            store.set(_key("refusal"), "1")
            return
        store.wait([_key("refusal")])
    except RuntimeError:  # the store is gone (torchrun is stopping the job) or rank 0 never refused: exit anyway
        return
    # torchrun stops the job once rank 0 has exited: wait for its SIGTERM (at most REFUSAL_WAIT) and exit with
    # status 2 then, the status of a refusal, which torchrun reports for every rank.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(2))
    time.sleep(REFUSAL_WAIT.total_seconds())


def fault_said(dist: Dist, said: bool) -> bool:
    """Under torchrun, after a fault of the machine stopped work: this process has `said` it, and posts that in
    torchrun's store; or it has not, and returns whether another process has, so that it leaves quietly (its
    collectives failed because that process exited). Elsewhere returns `said`."""
    try:
        store = _agent_store(dist)
        if store is not None and said:
            store.set(_key("fault"), "1")
        return said or (store is not None and bool(store.check([_key("fault")])))
    except RuntimeError:  # the store is gone: torchrun is stopping the job
        return said


def barrier(dist: Dist) -> None:
    """Wait for every process. Before a finished job leaves its process group, so that no rank closes its
    connections while another still uses them (gloo then aborted the slower rank at exit, "terminate called
    without an active exception", seen once on a loaded 2-core machine)."""
    if dist.active and td.is_initialized():
        td.barrier()


def teardown(dist: Dist) -> None:
    if dist.active and td.is_initialized():
        td.destroy_process_group()


def all_sum(value: float | int, dist: Dist, device: torch.device) -> float:
    """The sum of `value` over every process."""
    if not dist.active:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    td.all_reduce(t)
    return float(t.item())


def gather(obj: Any, dist: Dist) -> list[Any]:
    """`obj` from every process, in rank order (tensors are moved to the CPU first)."""
    if not dist.active:
        return [obj]
    out: list[Any] = [None] * dist.world_size
    td.all_gather_object(out, obj)
    return out


def broadcast(obj: Any, dist: Dist) -> Any:
    """Rank 0's `obj`, on every process."""
    if not dist.active:
        return obj
    box = [obj]
    td.broadcast_object_list(box, src=0)
    return box[0]


def check_identical(model: torch.nn.Module, dist: Dist) -> None:
    """Refuse unless every process built the same fixed tensors (buffers, frozen parameters): training never
    synchronises them."""
    if not dist.active:
        return
    fixed = dict(model.named_buffers())
    fixed.update({n: p for n, p in model.named_parameters() if not p.requires_grad})
    fingerprint = hashlib.sha256()  # of every fixed tensor's name and values
    for name in sorted(fixed):
        fingerprint.update(name.encode())
        fingerprint.update(fixed[name].detach().float().cpu().numpy().tobytes())
    prints = gather(fingerprint.hexdigest(), dist)
    if len(set(prints)) != 1:
        raise RuntimeError(
            f"the processes built different fixed tensors (MixiT matrices or frozen weights): "
            f"fingerprints {prints}; every rank must build the model from the same config and seed"
        )


def split(n: int, dist: Dist, accum: int, what: str = "batch_size") -> int:
    """The examples each process takes per micro-batch, refusing a batch that does not split evenly."""
    parts = dist.world_size * accum
    if n % parts:
        raise UsageError(
            f"{what} {n} must be divisible by the world size {dist.world_size} x grad_accum {accum} = {parts}"
        )
    return n // parts
