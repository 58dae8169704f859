"""The precision of the forward pass: fp32, or bf16 / fp16 under autocast (fp16 with a gradient scaler)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """The dtype of the forward pass: fp32, or bf16 / fp16 under autocast (fp16 with a gradient scaler)."""

    def __init__(self, dtype: str, device: torch.device):
        self.name, self.device = dtype, device
        self.dtype = DTYPES[dtype]
        self.scaler = torch.amp.GradScaler(device.type) if dtype == "fp16" else None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context of a forward pass: autocast to the dtype, or nothing for fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def state_dict(self) -> dict[str, Any]:
        """The gradient scaler's state, saved with a checkpoint (empty without a scaler)."""
        return {} if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the gradient scaler's state from a checkpoint (nothing without a scaler or a state)."""
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
