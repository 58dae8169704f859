"""A run's checkpoints: written, pruned, kept and loaded back (the files of RUN/checkpoints/, `mixit.core.run`).

    checkpoints/latest          the name of the newest complete checkpoint directory
    checkpoints/step_0000500/   one checkpoint:
        model.safetensors       parameters and persistent buffers (MixiT matrices)
        optimizer.safetensors   AdamW's moments, by "<param index>.<name>"
        state.json              step, optimizer param groups, fp16's gradient scale, and whether it is kept

The functions take the checkpoints directory `root` (`Run.checkpoints_dir`) or one checkpoint's directory
`ckpt`. No pickle: tensors go to safetensors, the rest to JSON. A write killed at any moment is harmless:
- a checkpoint is written under a temporary name (step_0000500.tmp), flushed to disk and renamed, so a directory
  named step_NNNNNNN is complete (`partial_checkpoints` lists the others, for the next session to remove); a
  failed write (a full disk) removes its temporary directory at once, to fill the disk no further;
- ``latest`` is pointed at it only then, so a run killed mid-write resumes from the previous checkpoint;
- every other checkpoint is then removed unless its state.json says it is kept: a run holds its kept
  checkpoints and its newest one, whatever a later session (a resume) keeps.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from mixit.core.precision import Precision
from mixit.errors import UsageError, damaged, machine_fault
from mixit.files import give_open_mode, read_json, write_json, write_text

LATEST = "latest"
STEP_PREFIX = "step_"
MODEL = "model.safetensors"
OPTIMIZER = "optimizer.safetensors"
STATE = "state.json"

REPLAY = "replay the run into a new directory with `mixit train --config RUN_DIR --out NEW_DIR`"
"""What to do about a damaged checkpoint: its run's config.json trains the run again."""


def is_count(value: Any) -> bool:
    """Whether `value`, read from a run's file, is an integer >= 0 (a step)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def checkpoint_path(root: Path, step: int) -> Path:
    """The directory of checkpoint `step` (which may not exist: `checkpoint_steps` lists those that do)."""
    return root / f"{STEP_PREFIX}{step:07d}"


def checkpoint_steps(root: Path) -> list[int]:
    """The steps of the complete checkpoints in `root`, in order: the kept ones and the newest."""
    digits = [child.name.removeprefix(STEP_PREFIX) for child in root.glob(f"{STEP_PREFIX}*") if child.is_dir()]
    return sorted(int(d) for d in digits if d.isdigit())


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint (``latest`` names it), None before the first; a ``latest`` naming a
    directory that is not there is refused."""
    pointer = root / LATEST
    if not pointer.exists():
        return None
    with damaged(pointer, REPLAY):
        found = root / pointer.read_text().strip()
        if not found.is_dir():
            raise UsageError(f"{pointer} points at {found.name}, which does not exist: the checkpoint is corrupt")
    return found


def partial_checkpoints(root: Path) -> list[Path]:
    """The checkpoint directories of killed writes (still under their temporary names)."""
    return sorted(root.glob(f"{STEP_PREFIX}*.tmp"))


def save_checkpoint(
    root: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    precision: Precision | None = None,
    keep: bool = False,
) -> Path:
    """Write checkpoint `step` (recording `keep`: module docstring), point ``latest`` at it, then remove every
    other checkpoint not kept.

    A kept checkpoint of `step` already there (a session killed before pointing ``latest`` at it, then resumed:
    resumption is bit-exact, so it holds what would be written) is left as it is, so that no moment of a
    rewrite finds it missing."""
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(root, step)
    if not _is_kept(final):
        tmp = root / (final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(tmp / MODEL))
            # AdamW's state: tensors only (module docstring); its param groups go to state.json.
            opt = optimizer.state_dict()
            moments = {
                f"{i}.{k}": v.detach().cpu().contiguous() for i, per in opt["state"].items() for k, v in per.items()
            }
            save_file(moments, str(tmp / OPTIMIZER))
            scaler = precision.state_dict() if precision is not None else {}
            meta = {"step": step, "optimizer": {"param_groups": opt["param_groups"]}, "scaler": scaler, "keep": keep}
            write_json(tmp / STATE, meta)
            for file in (tmp / MODEL, tmp / OPTIMIZER):
                give_open_mode(file)  # safetensors' own is 0600
                _fsync(file)
            _fsync(tmp)
        except BaseException:  # a failed write (a full disk) leaves no half checkpoint behind, to fill it further
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    write_text(root / LATEST, final.name + "\n")
    _fsync(root)
    for old in checkpoint_steps(root):
        held = checkpoint_path(root, old)
        if held != final and not _is_kept(held):
            shutil.rmtree(held, ignore_errors=True)
    return final


def load_model_state(model: nn.Module, ckpt: Path) -> None:
    """Load checkpoint `ckpt`'s parameters and buffers into `model`, refusing any mismatch."""
    with damaged(ckpt / MODEL, REPLAY):
        state = _load_tensors(ckpt / MODEL)
        why = mismatch(state, model.state_dict())
        if why is not None:
            raise UsageError(f"checkpoint {ckpt} does not match the model in config.json ({why})")
        model.load_state_dict(state)


def mismatch(tensors: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> str | None:
    """How `tensors`, read from a file (a checkpoint's, an export's), differ from a model's `expected` tensors in
    names or shapes; None where they do not."""
    if set(tensors) != set(expected):
        missing = sorted(set(expected) - set(tensors))[:3]
        extra = sorted(set(tensors) - set(expected))[:3]
        return f"missing {missing}, unexpected {extra}"
    for key, value in tensors.items():
        if value.shape != expected[key].shape:
            return f"{key} has shape {tuple(value.shape)}, the model expects {tuple(expected[key].shape)}"
    return None


def load_training_state(optimizer: torch.optim.Optimizer, ckpt: Path, precision: Precision | None = None) -> int:
    """Load checkpoint `ckpt`'s optimizer state (and fp16's gradient scale); return its step."""
    with damaged(ckpt, REPLAY):  # an entry missing or of another type: `damaged` names the checkpoint
        meta = read_json(ckpt / STATE, "checkpoint state.json")
        state: dict[int, dict[str, torch.Tensor]] = {}
        for name, tensor in _load_tensors(ckpt / OPTIMIZER).items():
            i, key = name.split(".", 1)
            state.setdefault(int(i), {})[key] = tensor
        optimizer.load_state_dict({"state": state, "param_groups": meta["optimizer"]["param_groups"]})
        if precision is not None:
            precision.load_state_dict(meta.get("scaler", {}))
        step = meta["step"]
        if not is_count(step) or ckpt.name != checkpoint_path(ckpt.parent, step).name:
            raise UsageError(f"checkpoint {ckpt} has a corrupt state.json (step {step!r}, not its own step)")
    return step


def _fsync(path: Path) -> None:
    """Flush the file `path` to disk, or the entries of the directory `path` (a rename or a new file in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_kept(ckpt: Path) -> bool:
    """Whether `ckpt` records that it is kept (a state.json missing or unreadable: not kept)."""
    try:
        state = json.loads((ckpt / STATE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and state.get("keep") is True


def _load_tensors(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of checkpoint file `file`, refused in words that name it (`damaged` adds what to do); a fault of
    the machine (no permission, too many open files) is raised as it is, for `damaged` to say as such."""
    try:
        return load_file(str(file))
    except FileNotFoundError:
        raise UsageError(f"checkpoint file {file} is missing") from None
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        if machine_fault(e) is not None:
            raise
        raise UsageError(f"checkpoint file {file} is corrupt or unreadable ({e})") from None
