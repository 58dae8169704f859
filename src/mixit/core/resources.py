"""Memory estimates, checked before anything large is allocated.

A run, an evaluation, a sample or a signal sweep that cannot fit would die
in an allocation (or take the machine down with it) minutes into its work.
Each command first estimates what it will hold at once and refuses, with one
line naming the estimate, its largest part and the memory available, when
the estimate exceeds what the device has free (docs/reliability.md).

The estimates are deliberately on the generous side (every projection
counted as if the attention kind had q, k, v and o; a T x T pattern per head
and layer kept for the backward pass; float32 throughout): a refusal means the
run would not fit, and a run that passes has room. Where the free memory
cannot be read (not Linux, not CUDA), nothing is refused.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from mixit.core.config import ModelConfig
from mixit.errors import UsageError
from mixit.runtime import available_memory

FLOAT = 4  # bytes of a float32
GIB = 2**30


def model_numel(cfg: ModelConfig) -> tuple[int, int]:
    """(parameters, buffer elements) of a model of `cfg`, an upper bound for any attention kind."""
    d, dm, L, T, H = cfg.d_model, cfg.d_mlp or 4 * cfg.d_model, cfg.n_layers, cfg.n_ctx, cfg.n_heads
    out = cfg.vocab_size if cfg.head == "lm" else cfg.n_classes
    per_block = 4 * (d * d + d) + 3 * d * dm + 2 * dm + d + 2 * d  # q, k, v, o; gate, up, down; two norms
    params = cfg.vocab_size * d + T * d + L * per_block + d + d * out
    buffers = L * H * T * T + 2 * T * d  # fixed T x T matrices per head, RoPE tables
    return params, buffers


def model_bytes(cfg: ModelConfig) -> int:
    params, buffers = model_numel(cfg)
    return FLOAT * (params + buffers)


def activation_bytes(cfg: ModelConfig, batch: int, seq: int, backward: bool = True) -> int:
    """What a forward pass of `batch` sequences of `seq` tokens holds (kept for the backward pass if `backward`)."""
    d, dm, L, H = cfg.d_model, cfg.d_mlp or 4 * cfg.d_model, cfg.n_layers, cfg.n_heads
    out = cfg.vocab_size if cfg.head == "lm" else cfg.n_classes
    kept = batch * seq * L * (10 * d + 4 * dm) + batch * L * H * seq * seq + 3 * batch * seq * out
    # Without a backward pass only about one layer's worth is alive at a time.
    return FLOAT * (kept if backward else kept // max(L, 1) + 3 * batch * seq * out)


def training_parts(cfg: ModelConfig, batch: int, eval_batch: int, test_examples: int) -> dict[str, int]:
    """The parts of a training run's memory, in bytes."""
    params, buffers = model_numel(cfg)
    T = cfg.n_ctx
    return {
        "parameters, gradients and optimizer state": FLOAT * (4 * params + buffers),
        f"activations at batch {batch}": activation_bytes(cfg, batch, T),
        f"evaluation at batch {eval_batch}": activation_bytes(cfg, eval_batch, T, backward=False),
        f"test set of {test_examples:,} examples": test_examples * T * 25,
    }


def check_memory(what: str, parts: Mapping[str, int], device: torch.device | str = "cpu", hint: str = "") -> None:
    """Refuse, with one line, if `parts` (name -> bytes) add up to more than `device` has free."""
    free = available_memory(torch.device(device))
    need = sum(parts.values())
    if free is None or need <= free:
        return
    largest = max(parts, key=lambda k: parts[k])
    detail = ", ".join(f"{k} {v / GIB:.1f} GiB" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v)
    raise UsageError(
        f"{what} needs about {need / GIB:.1f} GiB ({detail}) but {free / GIB:.1f} GiB of memory is "
        f"available on {device}; the largest part is {largest}" + (f"; {hint}" if hint else "")
    )


def inference_parts(cfg: ModelConfig, rows: int, label: str) -> dict[str, int]:
    """The memory a forward pass without gradients over `rows` sequences of n_ctx tokens needs, by part
    (`label` names the rows in a refusal), for `check_memory`."""
    return {"the model": model_bytes(cfg), label: activation_bytes(cfg, rows, cfg.n_ctx, backward=False)}
