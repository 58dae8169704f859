"""The tolerance of every float comparison in the tests, derived from the arithmetic instead of picked by hand.

Two computations of one quantity (another library, a fused, padded or compiled kernel, another grouping of a
batch, another CPU's SIMD width) round differently. A tolerance fitted to one machine's roundings fails on the
next (issue #28); one derived from the dtype's precision holds on any. The model of error, to first order in
eps = torch.finfo(dtype).eps (Higham, "Accuracy and Stability of Numerical Algorithms", chapters 2 and 3):

- a rounding changes a value by at most eps / 2 relative to itself;
- a sum of n terms (an inner product, a mean, a normaliser), added in any order, is off by at most
  (n - 1) eps / 2 times the sum of the terms' magnitudes;
- two computations that differ only in the order of their roundings each obey that bound, so they differ
  by at most n eps times the magnitude of the terms;
- a chain of such sums (a forward pass: normalisation, projections, scores, softmax) adds its n's, as long
  as each step keeps the scale of its input, which RMSNorm does. Elementwise operations (RoPE, SiLU, the
  residual additions) round once each: a handful per layer, small next to the sums, and not counted.

So ``assert_close(actual, expected, terms=n, scale=s)`` asserts |actual - expected| <= n eps s elementwise.
The test states ``terms`` from what its computation does: an inner product's length, the terms summed
along a chain (`forward_terms`), the roundings of a stored value. ``scale`` is the magnitude of what was
summed: max |expected| by default, given by the test where the result is smaller than its summands
(cancellation: signed entries of a row summing to 1, a softmax of large scores). The counts are worst cases,
not the sqrt(n) that independent roundings give typically, so the bound does not depend on luck.
"""

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def assert_close(
    actual: Any,
    expected: Any,
    *,
    dtype: torch.dtype | None = None,
    terms: float = 1,
    scale: float | torch.Tensor | None = None,
    msg: str = "",
) -> None:
    """Assert |actual - expected| <= eps(dtype) × terms × scale, elementwise (the model of error above).

    actual, expected: tensors, arrays, numbers or (nested) lists of numbers of one shape, or dicts of them with
    the same keys (each value compared on its own scale). dtype: the precision the computation rounded to; by
    default the coarser floating dtype of the two, where Python floats count as float64 (so a number read out of
    a float32 computation needs dtype=torch.float32). terms: how many roundings the computation accumulates.
    scale: the magnitude of what was summed, a number or a tensor broadcasting against `expected`; by default
    max |expected|. Equal values pass whatever the bound (infinities included). msg: what is compared, for the
    message.
    """
    if isinstance(expected, Mapping):
        assert isinstance(actual, Mapping) and actual.keys() == expected.keys(), f"{msg} keys: {actual} != {expected}"
        for key in expected:
            assert_close(actual[key], expected[key], dtype=dtype, terms=terms, scale=scale, msg=f"{msg}[{key!r}]")
        return
    prefix = f"{msg}: " if msg else ""
    a, e = _tensor(actual), _tensor(expected)
    assert a.shape == e.shape, f"{prefix}shapes differ: {tuple(a.shape)} and {tuple(e.shape)}"
    if dtype is None:
        floats = [t.dtype for t in (a, e) if t.is_floating_point()] or [torch.float64]
        dtype = max(floats, key=lambda d: torch.finfo(d).eps)
    a, e = a.detach().double().cpu(), e.detach().double().cpu()
    if scale is None:
        scale = e.abs().max() if e.numel() else torch.tensor(0.0, dtype=torch.float64)
    eps = torch.finfo(dtype).eps
    bound = (eps * terms * torch.as_tensor(scale, dtype=torch.float64).cpu()).expand_as(e)
    error = (a - e).abs()
    bad = (a != e) & ~(error <= bound)  # NaN fails, equal infinities pass
    if bad.any():
        worst = int(torch.where(bad, error.nan_to_num(nan=float("inf")), -1.0).argmax())
        index = np.unravel_index(worst, e.shape) if e.dim() else ()
        w_err, w_bound = error.flatten()[worst].item(), bound.flatten()[worst].item()
        raise AssertionError(
            f"{prefix}{int(bad.sum())} of {e.numel()} elements differ by more than eps({dtype}) {eps:.3g} × terms "
            f"{terms:g} × scale; the worst at {tuple(int(i) for i in index)}: actual {a.flatten()[worst].item():.9g},"
            f" expected {e.flatten()[worst].item():.9g}, off by {w_err:.3g} > {w_bound:.3g} "
            f"({w_err / w_bound * terms:.1f} terms' worth)"
        )


def _tensor(value: Any) -> torch.Tensor:
    """`value` as a tensor, keeping a tensor's or an array's dtype; Python numbers become float64."""
    if isinstance(value, torch.Tensor):
        return value
    array = np.asarray(value)
    if not np.issubdtype(array.dtype, np.floating):
        array = array.astype(np.float64)
    return torch.from_numpy(np.ascontiguousarray(array))


def forward_terms(cfg: Any) -> int:
    """The terms summed along the longest path through one forward pass of a `ModelConfig`, for `terms`.

    Per layer: RMSNorm's d_model squares, a q, k or v projection's d_model, the scores' d_head, the
    softmax's normaliser and A V's n_ctx each (a mixing matrix has A V only), the output projection's
    d_model, RMSNorm's d_model again, a gate or up projection's d_model and the down projection's d_mlp.
    Then the final RMSNorm's and the head's d_model, and the n_ctx of a classifier's mean pooling.
    """
    per_layer = 5 * cfg.d_model + cfg.d_head + 2 * cfg.n_ctx + cfg.d_mlp
    return cfg.n_layers * per_layer + 2 * cfg.d_model + cfg.n_ctx


def training_terms(cfg: Any) -> int:
    """The roundings by which two float32 runs of one `RunConfig` may differ when their arithmetic is grouped
    differently (two ranks or one process, micro-batches or one batch, compiled or eager kernels).

    Each step's gradient is a forward and a backward chain (`forward_terms` each) ending in a sum over the
    batch_size × n_ctx positions of the batch. AdamW divides the gradient's running mean by its running root
    mean square, each changed by the gradient's relative error: its step changes by twice that. The steps
    compound: weights off by a fraction of the distance trained make the next gradient off by about that
    fraction of itself (training changes a gradient wholly as the weights move that distance), so step t
    carries the roundings of all t steps, at most `steps` steps' worth. The test loss adds one more forward
    pass and its sum over the test_size × n_ctx positions.
    """
    model, train = cfg.model, cfg.train
    per_step = 2 * forward_terms(model) + train.batch_size * model.n_ctx
    return 2 * train.steps * per_step + forward_terms(model) + cfg.test_size * model.n_ctx


def assert_trained_alike(actual: Mapping, expected: Mapping, cfg: Any) -> None:
    """The weights (name -> tensor) of two float32 runs of one `RunConfig` that `training_terms` describes.

    An AdamW step moves a weight by about its learning rate, whatever the gradient's size, so a relative
    change of the steps is one relative to the distance the weights moved, the sum of the learning rates.
    """
    moved = sum(cfg.train.lr_at(step) for step in range(cfg.train.steps))
    assert_close(actual, expected, dtype=torch.float32, terms=training_terms(cfg), scale=moved)


def sampling_error(n: int) -> float:
    """A tolerance on the standard deviation of n normal draws, relative to the true one: a sampling error, not a
    rounding one. Its standard error is 1 / sqrt(2 n); five of them. (A variance's is twice that.)"""
    return 5 / math.sqrt(2 * n)
