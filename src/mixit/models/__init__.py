"""The mixit decoder, its attention kinds and hook points."""

from mixit.models.attention import ATTENTION, MixingAttention, SoftmaxAttention, mixit_matrices
from mixit.models.hooks import HookPoint, capture_patterns
from mixit.models.transformer import Transformer

__all__ = [
    "ATTENTION",
    "HookPoint",
    "MixingAttention",
    "SoftmaxAttention",
    "Transformer",
    "capture_patterns",
    "mixit_matrices",
]
