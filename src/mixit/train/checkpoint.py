"""Run directories and checkpoints: safetensors for tensors, JSON for the rest.

A run directory holds

    config.json          the full RunConfig, mixit version, git commit
    metrics.jsonl        one JSON object per log or evaluation event
    summary.json         final metrics (written when the run completes)
    checkpoints/latest   name of the newest complete checkpoint directory
    checkpoints/step_0000500/
        model.safetensors       parameters and persistent buffers (MixiT matrices)
        optimizer.safetensors   AdamW moments, flattened
        state.json              step and optimizer hyper-parameters

No pickle anywhere: a checkpoint cannot carry code. A checkpoint directory is
complete before `latest` points at it (the pointer is replaced atomically),
so a run killed mid-write resumes from the previous checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from mixit import __version__
from mixit.config import RunConfig
from mixit.errors import UsageError

CONFIG = "config.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"


def git_commit() -> str | None:
    """The commit of the mixit source tree, if it is a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist: not a mixit run directory ({what} missing)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} is corrupt ({what} is not valid JSON: {e})") from None


def save_config(run_dir: Path, cfg: RunConfig) -> None:
    write_json(run_dir / CONFIG, {"config": cfg.to_dict(), "mixit_version": __version__,
                                  "git_commit": git_commit()})


def load_config(run_dir: Path) -> RunConfig:
    data = read_json(Path(run_dir) / CONFIG, "config.json")
    if not isinstance(data, dict) or "config" not in data:
        raise UsageError(f"{Path(run_dir) / CONFIG} is corrupt: no 'config' entry")
    return RunConfig.from_dict(data["config"])


def _flatten_optimizer(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for idx, per_param in state["state"].items():
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{idx}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for flat, value in list(tensors.items()) + list(meta["scalars"].items()):
        idx, key = flat.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(run_dir: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> Path:
    """Write checkpoint `step`, point `latest` at it, delete older ones."""
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:07d}"
    final = root / name
    tmp = root / (name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / "model.safetensors"))
    opt_tensors, opt_meta = _flatten_optimizer(optimizer.state_dict())
    save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
    write_json(tmp / "state.json", {"step": step, "optimizer": opt_meta})
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    latest = root / "latest"
    latest_tmp = root / "latest.tmp"
    latest_tmp.write_text(name + "\n")
    os.replace(latest_tmp, latest)
    for old in root.iterdir():
        if old.is_dir() and old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    latest = Path(run_dir) / CHECKPOINTS / "latest"
    if not latest.exists():
        return None
    path = latest.parent / latest.read_text().strip()
    if not path.is_dir():
        raise UsageError(f"{latest} points at {path.name}, which does not exist: the checkpoint is corrupt")
    return path


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise UsageError(f"checkpoint file {path} is missing") from None
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise UsageError(f"checkpoint file {path} is corrupt or unreadable ({e})") from None


def load_model_state(ckpt: Path, model: nn.Module) -> None:
    """Load parameters and buffers into `model`, refusing any mismatch."""
    state = _load_tensors(ckpt / "model.safetensors")
    expected = model.state_dict()
    if set(state) != set(expected):
        missing = sorted(set(expected) - set(state))[:3]
        extra = sorted(set(state) - set(expected))[:3]
        raise UsageError(f"checkpoint {ckpt} does not match the model in config.json "
                         f"(missing {missing}, unexpected {extra})")
    for key, value in state.items():
        if value.shape != expected[key].shape:
            raise UsageError(f"checkpoint {ckpt}: {key} has shape {tuple(value.shape)}, "
                             f"the model expects {tuple(expected[key].shape)}")
    model.load_state_dict(state)


def load_training_state(ckpt: Path, optimizer: torch.optim.Optimizer) -> int:
    """Load the optimizer state; return the step the checkpoint was taken after."""
    meta = read_json(ckpt / "state.json", "checkpoint state.json")
    tensors = _load_tensors(ckpt / "optimizer.safetensors")
    try:
        optimizer.load_state_dict(_unflatten_optimizer(tensors, meta["optimizer"]))
        return int(meta["step"])
    except (KeyError, ValueError, TypeError) as e:
        raise UsageError(f"checkpoint {ckpt} has a corrupt optimizer state ({e})") from None
