"""Data-parallel training under torchrun: the process group and the few collectives mixit needs.

`torchrun --nproc-per-node N -m mixit train ...` starts N processes with
RANK, WORLD_SIZE and LOCAL_RANK in their environment; `setup` reads them,
picks the backend (nccl on GPUs, gloo on CPUs), binds each process to its
GPU, and returns a `Dist`. Without those variables it returns the trivial
single-process `Dist`, and every helper below is a no-op, so the training
loop has one code path (docs/scaling.md).
"""

from __future__ import annotations

import hashlib
import os
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


def env_world() -> Dist:
    """The job as torchrun (or Slurm through submitit) describes it in the environment."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        raise UsageError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (torchrun sets them)") from None
    return Dist(rank, world, local)


def setup(device: torch.device) -> tuple[Dist, torch.device]:
    """Join the process group of a torchrun job (if this is one) and return it with this process's device."""
    dist = env_world()
    if not dist.active:
        return dist, device
    if device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
        torch.cuda.set_device(device)
    if not td.is_initialized():
        td.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist, device


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


def fingerprint(tensors: dict[str, torch.Tensor]) -> str:
    """A hash of the values of `tensors` (to check that every process holds the same ones)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def check_identical(model: torch.nn.Module, dist: Dist) -> None:
    """Refuse loudly unless every process built the same fixed tensors: the MixiT matrices (buffers)
    and every frozen parameter, which training never synchronises."""
    if not dist.active:
        return
    fixed = {n: b for n, b in model.named_buffers()}
    fixed.update({n: p for n, p in model.named_parameters() if not p.requires_grad})
    prints = gather(fingerprint(fixed), dist)
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
