"""The mixit decoder, its attention kinds and hook points."""

from mixit.models.attention import (
    ATTENTION,
    MixingAttention,
    RandFormerAttention,
    SoftmaxAttention,
    SynthesizerRandomAttention,
    UniformAttention,
    mixit_matrices,
)
from mixit.models.hooks import HookPoint, capture_patterns
from mixit.models.transformer import Transformer

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
