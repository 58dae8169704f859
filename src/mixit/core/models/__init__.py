"""The mixit decoder, its attention kinds and hook points."""

from mixit.core.models.attention import (
    ATTENTION,
    MixingAttention,
    RandFormerAttention,
    SoftmaxAttention,
    SynthesizerRandomAttention,
    UniformAttention,
    mixit_matrices,
)
from mixit.core.models.hooks import HookPoint, capture_patterns
from mixit.core.models.transformer import Transformer

__all__ = [
    "ATTENTION",
    "HookPoint",
    "MixingAttention",
    "RandFormerAttention",
    "SoftmaxAttention",
    "SynthesizerRandomAttention",
    "Transformer",
    "UniformAttention",
    "capture_patterns",
    "mixit_matrices",
]
