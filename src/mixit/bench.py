"""`mixit bench`: training throughput, peak memory and model FLOPs utilisation.

For one model shape (width, depth, heads, vocabulary, sequence length, batch)
on one device, every requested variant is trained for a few steps with the
training loop's own step (`train_step`: forward, loss, backward, clipping,
AdamW, in the precision the training loop uses: `mixit.precision.Precision`)
on a fixed random batch, and timed after warm-up:

    step time      median over `repeats` timed blocks of `steps` steps, each
                   one `torch.utils.benchmark.Timer.timeit` (two untimed calls,
                   then the block; the GPU is synchronised around it)
    tokens/s       batch * seq / step time (every position is a prediction)
    model FLOPs    the matrix-product FLOPs of one real training step, counted
                   by `torch.utils.flop_counter.FlopCounterMode` (`count_flops`)
    MFU            model FLOPs / step time / the device's measured matmul peak
    peak memory    the most memory the row's training held at once (model,
                   gradients, optimizer state, activations), measured during
                   its warm-up as the peak above what the process held before
                   the model was built: CUDA allocator statistics, or on Linux
                   the peak resident set (VmHWM) after returning free heap
                   memory to the system

All rows are built and warmed up first, then timed round-robin: timed block r
of every row runs before block r + 1 of any, so a slow spell of a shared
machine lands on all rows alike instead of on whichever ran during it
(torch.utils.benchmark times one statement at a time and its `Compare` only
tabulates, so `time_interleaved` loops over one Timer per row).

The peak is measured by the same command, as one more contender in the
round-robin (square matmuls in the dtype in use; the best block counts), so MFU
compares against what this machine does at the same time, not a datasheet. A
Hugging Face `LlamaForCausalLM` of the same shape, trained with the same loss
and a plain `torch.optim.AdamW` step, is timed in the same run where
`transformers` is installed (the `bench` extra); otherwise its row is skipped
with a note. With a task, the time to generate one training batch is
measured as well, so data generation can be compared with the step it feeds.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.benchmark import Measurement, Timer
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from mixit.config import ModelConfig, TrainConfig, typed
from mixit.errors import UsageError
from mixit.experiment import model_config
from mixit.files import check_output_dir, write_json
from mixit.freezing import VARIANTS, apply_variant
from mixit.models import Transformer
from mixit.precision import DTYPES, Precision
from mixit.resources import activation_bytes, check_memory, model_bytes
from mixit.runtime import release_free_memory, resolve_device
from mixit.tasks import make_task
from mixit.training.optim import build_optimizer
from mixit.training.step import train_step
from mixit.version import __version__, git_commit, install_hint

aten = torch.ops.aten
HF_NAME = "hf_llama"
PEAK_NAME = "matmul_peak"


@dataclasses.dataclass(frozen=True)
class Shape:
    """What is benchmarked: model size and the batch one step trains on; the vocabulary and the tokens per
    sequence are BenchOptions', or the task's (`shape_of`)."""

    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    vocab_size: int = 512
    seq_len: int = 128
    batch_size: int = 64

    def __post_init__(self) -> None:
        for name, value in dataclasses.asdict(self).items():
            object.__setattr__(self, name, typed(name, int, value))  # frozen: set once, as read
            if getattr(self, name) <= 0:
                raise UsageError(f"{name} must be a positive integer, got {value!r}")
        self.model_config("standard")  # refuses what no model could have (heads not dividing the width, odd RoPE)

    def model_config(self, variant: str) -> ModelConfig:
        """The mixit model of this shape for `variant` (with the variant's own settings)."""
        return model_config(
            variant,
            vocab_size=self.vocab_size,
            n_ctx=self.seq_len,
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
        )

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """What `mixit bench` measures, and where it writes the result (one command-line flag per field)."""

    out: Path | None = None
    """The JSON file to write, never overwritten; null means runs/bench-<time>.json."""
    variants: Sequence[str] = VARIANTS.names()
    """The variants to time, comma-separated."""
    d_model: int = 256
    """Model width."""
    n_layers: int = 4
    """Number of blocks."""
    n_heads: int = 4
    """Attention heads; must divide d_model."""
    vocab_size: int | None = None
    """Vocabulary size; null means the task's, or 512 without a task."""
    seq_len: int | None = None
    """Tokens per sequence; null means the length the task's model reads, or 128 without a task."""
    batch_size: int = 64
    """Sequences per training step."""
    task: str | None = None
    """Take the vocabulary and sequence length from this task, and measure how long one of its batches takes to
    generate; null times the models alone."""
    task_params: dict[str, Any] | None = None
    """The task's parameters (with task)."""
    device: str = "auto"
    """Where to run: auto (cuda if available, else cpu), cpu, cuda or cuda:N."""
    dtype: str = "fp32"
    """Precision: fp32, or bf16 or fp16 under autocast (cuda only)."""
    compile: bool = False
    """Compile the models with torch.compile."""
    warmup: int = 3
    """Untimed steps before the timed ones, during which peak memory is measured."""
    steps: int = 3
    """Training steps per timed block."""
    repeats: int = 5
    """Timed blocks; the median of their times is reported."""
    baseline: bool = True
    """Time a Hugging Face Llama of the same shape too, as a baseline row."""
    profile: bool = False
    """After timing, profile one more step of each row and print where its time goes."""


# -- timing, FLOPs and the hardware limit ------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclasses.dataclass
class Contender:
    """One row to time: a zero-argument training step and what it is."""

    name: str
    step: Callable[[], Any]
    flops: int
    n_trainable: int
    n_params: int


def time_interleaved(
    contenders: Sequence[Contender], device: torch.device, steps: int, repeats: int
) -> dict[str, Measurement]:
    """Each contender's `repeats` timed blocks of `steps` calls (one `Timer.timeit` each), the blocks interleaved
    across contenders, merged into one Measurement per contender (its `times` are seconds per call, one per
    block)."""

    def clock() -> float:  # Timer's own clock synchronises the current GPU, which need not be `device`
        _sync(device)
        return time.perf_counter()

    timers = [
        Timer("step()", timer=clock, globals={"step": c.step}, description=c.name, num_threads=torch.get_num_threads())
        for c in contenders
    ]
    blocks = [timer.timeit(steps) for _ in range(repeats) for timer in timers]
    return {m.description: m for m in Measurement.merge(blocks)}


# CPU SDPA runs a kernel of its own that FlopCounterMode has no formula for (it counts it as 0 FLOPs,
# pytorch/pytorch#195460); its arguments lead with those of the CUDA flash kernel, so that kernel's formula fits
# (unwrapped: `custom_mapping` wraps what it is given to read shapes, as the registry's entry already does).
_CPU_ATTENTION = {
    cpu_op: flop_registry[cuda_op].__wrapped__
    for cpu_op, cuda_op in [
        (aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention),
        (aten._scaled_dot_product_flash_attention_for_cpu_backward, aten._scaled_dot_product_flash_attention_backward),
    ]
}


def count_flops(step: Callable[[], Any]) -> int:
    """The FLOPs of one call of `step` as FlopCounterMode counts them: matrix products (linear layers, attention
    scores and values over all T x T pairs, masked or not, forward and backward; a frozen weight's gradient is
    not computed, so not counted). Elementwise work, norms, softmax, the loss and the optimizer are not counted."""
    with FlopCounterMode(display=False, custom_mapping=_CPU_ATTENTION) as counter:
        step()
    return counter.get_total_flops()


def matmul_contender(device: torch.device, dtype: torch.dtype, n: int) -> Contender:
    """One product of two n x n matrices in `dtype` as a step to time: the
    device's dense matmul throughput, against which MFU is computed."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    return Contender(PEAK_NAME, lambda: a @ b, 2 * n**3, 0, 0)


# -- memory ---------------------------------------------------------------------------


def _memory_mb(device: torch.device, peak: bool) -> float | None:
    """CUDA: memory allocated now, or its peak since the last reset. CPU (Linux):
    the resident set now (VmRSS) or its peak (VmHWM). None where unknown."""
    if device.type == "cuda":
        used = torch.cuda.max_memory_allocated(device) if peak else torch.cuda.memory_allocated(device)
        return used / 2**20
    field = "VmHWM:" if peak else "VmRSS:"
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _memory_baseline(device: torch.device) -> float | None:
    """Reset the peak counter and return the memory held now (see `_memory_mb`)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        release_free_memory()  # the heap `tune_allocator` keeps would otherwise count as held
        try:  # Linux: writing 5 resets this process's VmHWM to its current resident set
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            return None
    return _memory_mb(device, peak=False)


MATMUL_KERNELS = ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "sm80_")
"""Name fragments of the GPU kernels that multiply matrices (cuBLAS's, CUTLASS's), for a profile's roll-up."""


def profile_step(contender: Contender, device: torch.device, top: int = 15) -> list[dict[str, Any]]:
    """Where one step's time goes: torch.profiler over one call of the step, the `top` operators by their own
    (self) time, each with its call count and its share of the step's total self time. On a CPU these are
    torch's operators; on a GPU the kernels (the operators that launch them would count their time twice)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        contender.step()
        _sync(device)
    if device.type == "cuda":
        events = [
            e
            for e in prof.key_averages()
            if e.device_type == DeviceType.CUDA
            and e.self_device_time_total > 0
            and not getattr(e, "is_user_annotation", False)  # a range such as the optimizer's step, not a kernel
        ]
        attr = "self_device_time_total"
    else:
        attr = "self_cpu_time_total"
        events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(getattr(e, attr) for e in events)
    events.sort(key=lambda e: getattr(e, attr), reverse=True)

    def entry(op: str, group: list[Any]) -> dict[str, Any]:
        spent = sum(getattr(e, attr) for e in group)
        return {"op": op, "self_ms": spent / 1e3, "calls": sum(e.count for e in group), "share": spent / total}

    rest = events[top:]  # the operators not listed by name, together
    return [entry(e.key, [e]) for e in events[:top]] + ([entry(f"({len(rest)} others)", rest)] if rest else [])


def profile_summary(profile: list[dict[str, Any]], step_ms: float) -> dict[str, float]:
    """A GPU profile in three numbers: the time the device was busy in one step, the part of it spent in matrix
    products (`MATMUL_KERNELS`, among the kernels listed by name), and the step's time (timed, not profiled) the
    device was idle, waiting for the host to launch work."""
    busy = sum(op["self_ms"] for op in profile)
    matmul = sum(op["self_ms"] for op in profile if any(k in op["op"].lower() for k in MATMUL_KERNELS))
    return {"busy_ms": busy, "matmul_ms": matmul, "idle_share": max(0.0, 1 - busy / step_ms)}


def _row(c: Contender, shape: Shape, timed: Measurement, peak: float, memory: float | None) -> dict[str, Any]:
    step_s = timed.median
    flops = c.flops  # model FLOPs of one step
    return {
        "name": c.name,
        "n_trainable": c.n_trainable,
        "n_params": c.n_params,
        "step_ms": 1e3 * step_s,
        "step_ms_iqr": 1e3 * timed.iqr,
        "step_ms_all": [1e3 * t for t in timed.times],
        "steps_per_s": 1 / step_s,
        "samples_per_s": shape.batch_size / step_s,
        "tokens_per_s": shape.tokens / step_s,
        "model_flops_per_step": flops,
        "achieved_flops_per_s": flops / step_s,
        "mfu": flops / step_s / peak,
        "peak_memory_mb": memory,
    }


def _batch(shape: Shape, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(shape.vocab_size, (shape.batch_size, shape.seq_len), generator=g)  # (B, T)
    y = torch.randint(shape.vocab_size, (shape.batch_size, shape.seq_len), generator=g)  # (B, T)
    return x.to(device), y.to(device)


def bench_variant(variant: str, shape: Shape, precision: Precision, compile: bool = False) -> Contender:
    """`variant` at `shape`, trained with mixit's own step on a fixed batch in `precision` (the row's own: an
    fp16 gradient scaler adapts to one model). Its FLOPs are counted over one step of the model run eagerly
    (`count_flops`; FlopCounterMode does not see into compiled kernels), which trains it by that step."""
    device = precision.device
    model = Transformer(shape.model_config(variant))
    report = apply_variant(model, variant)
    model.to(device).train()
    optimizer = build_optimizer(model, TrainConfig(), device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    x, y = _batch(shape, device)

    def step(forward: Callable[[torch.Tensor], torch.Tensor]) -> None:
        train_step(forward, optimizer, x, y, trainable, TrainConfig.grad_clip, precision)

    flops = count_flops(functools.partial(step, model))
    forward = torch.compile(model) if compile else model
    n_params = report.n_trainable + report.n_frozen
    return Contender(variant, functools.partial(step, forward), flops, report.n_trainable, n_params)


def hf_llama(shape: Shape) -> nn.Module | None:
    """A Hugging Face LlamaForCausalLM of `shape` (biases on, untied head, SDPA
    attention, as mixit's standard model), or None without `transformers`."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    config = LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.d_model,
        intermediate_size=4 * shape.d_model,
        num_hidden_layers=shape.n_layers,
        num_attention_heads=shape.n_heads,
        num_key_value_heads=shape.n_heads,
        max_position_embeddings=shape.seq_len,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=False,
        use_cache=False,
    )
    config._attn_implementation = "sdpa"
    # Hugging Face initialises from the global generator: seed it inside a fork,
    # so the caller's random state is left as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForCausalLM(config)


def bench_hf(shape: Shape, precision: Precision, compile: bool = False) -> Contender | None:
    """The baseline: the Llama model through mixit's own step (same loss,
    clipping, precision) but with a plain torch.optim.AdamW (same hyperparameters,
    torch's default implementation, every parameter trained); None without
    `transformers`. Its FLOPs are counted as `bench_variant`'s are."""
    model = hf_llama(shape)
    if model is None:
        return None
    device = precision.device
    model.to(device).train()
    tc = TrainConfig()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=tc.lr, betas=(tc.beta1, tc.beta2), weight_decay=tc.weight_decay
    )
    params = list(model.parameters())
    x, y = _batch(shape, device)

    def step(forward: Callable[..., Any]) -> None:
        train_step(lambda tokens: forward(input_ids=tokens).logits, optimizer, x, y, params, tc.grad_clip, precision)

    flops = count_flops(functools.partial(step, model))
    n = sum(p.numel() for p in params)
    return Contender(HF_NAME, functools.partial(step, torch.compile(model) if compile else model), flops, n, n)


def data_seconds(task_name: str, task_params: dict[str, Any], batch_size: int) -> float:
    """Median seconds to generate one training batch of `task_name` (as the training loop does: numpy
    generation, test-set exclusion, tensors), each call a new batch (the batch index counts up)."""
    task = make_task(task_name, task_params)
    timer = Timer(
        "task.train_batch(next(index), size)",
        globals={"task": task, "index": itertools.count(), "size": batch_size},
        num_threads=torch.get_num_threads(),
    )
    return timer.blocked_autorange(min_run_time=0.1).median


def run_bench(shape: Shape, options: BenchOptions, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Benchmark `options.variants` (and the Hugging Face baseline) at `shape`; return a
    JSON-serialisable dict with the environment, the measured peak, one row per
    variant and, with a task, the data-generation time per batch. With
    `options.profile`, each row also gets `profile_step`'s table of one more step.

    `shape` is what `shape_of(options)` makes of the options' model fields; `options.out` is not read here.
    `progress` is called with a line of text as each phase starts.
    """
    _check_options(options)
    dev = resolve_device(options.device)
    _check_room(shape, options, dev)
    task = options.task
    data_s = data_seconds(task, options.task_params or {}, shape.batch_size) if task is not None else None
    say = progress or (lambda message: None)
    peak_n = 8192 if dev.type == "cuda" else 2048
    peak_contender = matmul_contender(dev, DTYPES[options.dtype] or torch.float32, peak_n)
    contenders, memory, notes = _build_rows(shape, options, dev, say)
    say(
        f"timing {len(contenders)} rows and the matmul peak round-robin, "
        f"{options.repeats} blocks of {options.steps} steps"
    )
    timed = time_interleaved([peak_contender, *contenders], dev, options.steps, options.repeats)
    peak = {
        "n": peak_n,
        "best_flops_per_s": peak_contender.flops / min(timed[PEAK_NAME].times),
        "median_flops_per_s": peak_contender.flops / timed[PEAK_NAME].median,
    }
    rows = [_row(c, shape, timed[c.name], peak["best_flops_per_s"], memory[c.name]) for c in contenders]
    if options.profile:
        for contender, row in zip(contenders, rows):
            say(f"profiling one step of {contender.name}")
            row["profile"] = profile_step(contender, dev)
            if dev.type == "cuda":
                row["profile_summary"] = profile_summary(row["profile"], row["step_ms"])
    _compare(rows, data_s)
    return {
        "shape": dataclasses.asdict(shape),
        "device": str(dev),
        "device_name": _device_name(dev),
        "dtype": options.dtype,
        "threads": torch.get_num_threads(),
        "compile": options.compile,
        "torch": torch.__version__,
        "cuda": torch.version.cuda if dev.type == "cuda" else None,
        "mixit": __version__,
        "git_commit": git_commit(),
        "timing": {"warmup": options.warmup, "steps": options.steps, "repeats": options.repeats},
        "peak": peak,
        "task": options.task,
        "task_params": options.task_params or {},
        "data_ms_per_batch": None if data_s is None else 1e3 * data_s,
        "rows": rows,
        "notes": notes,
    }


def _check_options(options: BenchOptions) -> None:
    """Refuse unknown variants or dtypes, and timing counts below 1."""
    variants = options.variants
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise UsageError(
            f"unknown variant(s) {', '.join(map(repr, unknown)) or '(none given)'}; allowed: {', '.join(VARIANTS)}"
        )
    if options.dtype not in DTYPES:
        raise UsageError(f"unknown dtype {options.dtype!r}; allowed: {', '.join(DTYPES)}")
    for name in ("warmup", "steps", "repeats"):
        value = getattr(options, name)
        if typed(name, int, value) < 1:
            raise UsageError(f"{name} must be an integer >= 1, got {value!r}")


def _check_room(shape: Shape, options: BenchOptions, dev: torch.device) -> None:
    """Refuse a benchmark whose rows do not fit in memory together, and autocast off cuda."""
    # Every row is built and warmed up before the timing starts, so all models and their optimizer state are held
    # at once; a step's activations are freed when it ends, so one row's are held at a time.
    cfg = shape.model_config("standard")
    n_rows = len(options.variants) + int(options.baseline)
    check_memory(
        "this benchmark",
        {
            f"{n_rows} models with their optimizer state": n_rows * 4 * model_bytes(cfg),
            "one step's activations": activation_bytes(cfg, shape.batch_size, shape.seq_len),
        },
        dev,
        "lower the batch size, the sequence length, the model's size or the number of variants",
    )
    if options.dtype != "fp32" and dev.type != "cuda":
        raise UsageError(
            f"dtype {options.dtype} (autocast) is offered on cuda only; on this CPU fp32 is many times faster"
        )


def _build_rows(
    shape: Shape, options: BenchOptions, dev: torch.device, say: Callable[[str], None]
) -> tuple[list[Contender], dict[str, float | None], list[str]]:
    """Build and warm up every row, each with its own precision; return the rows, the peak memory each held
    during its warm-up, and notes on rows that could not be built."""
    builders: list[tuple[str, Callable[[], Contender | None]]] = [
        (variant, functools.partial(bench_variant, variant, shape, Precision(options.dtype, dev), options.compile))
        for variant in options.variants
    ]
    if options.baseline:
        builders.append((HF_NAME, functools.partial(bench_hf, shape, Precision(options.dtype, dev), options.compile)))
    contenders, memory, notes = [], {}, []
    for name, build in builders:
        say(f"building and warming up {name}")
        before = _memory_baseline(dev)
        contender = build()  # counts its FLOPs with one step, eager, outside the peak measured below
        if contender is None:
            notes.append(
                f"transformers is not installed: no Hugging Face baseline row ({install_hint('bench')} to add it)"
            )
            continue
        _memory_baseline(dev)  # restarts the peak counter; the baseline stays the one taken before building
        for _ in range(options.warmup):
            contender.step()
        after = _memory_mb(dev, peak=True)
        memory[name] = None if before is None or after is None else after - before
        contenders.append(contender)
    return contenders, memory, notes


def _compare(rows: list[dict[str, Any]], data_s: float | None) -> None:
    """Add to each row its speed-up over the Hugging Face row (where there is one) and, with a task, the
    share of a step that generating its batch would take."""
    hf = next((row for row in rows if row["name"] == HF_NAME), None)
    if hf is not None:
        for row in rows:
            if row is not hf:
                row["speedup_vs_hf"] = row["tokens_per_s"] / hf["tokens_per_s"]
    if data_s is not None:
        for row in rows:
            row["data_fraction"] = data_s / (data_s + row["step_ms"] / 1e3)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads"


def format_table(result: dict[str, Any]) -> str:
    """The result as a fixed-width text table with a header line."""
    peak = result["peak"]["best_flops_per_s"]
    s = result["shape"]
    lines = [
        f"mixit bench: d_model {s['d_model']}, {s['n_layers']} layers, {s['n_heads']} heads, vocab "
        f"{s['vocab_size']}, seq {s['seq_len']}, batch {s['batch_size']}; {result['device_name']}, "
        f"{result['dtype']}{', compiled' if result['compile'] else ''}; matmul peak {peak / 1e9:.1f} GFLOP/s"
    ]
    has_hf = any("speedup_vs_hf" in row for row in result["rows"])
    header = (
        f"{'variant':<11} {'trainable':>10} {'step ms':>9} {'tokens/s':>10} {'samples/s':>10} "
        f"{'GFLOP/step':>10} {'GFLOP/s':>8} {'MFU':>6} {'peak MB':>8}" + (f" {'vs HF':>6}" if has_hf else "")
    )
    lines.append(header)
    for row in result["rows"]:
        memory = "-" if row["peak_memory_mb"] is None else f"{row['peak_memory_mb']:.0f}"
        line = (
            f"{row['name']:<11} {row['n_trainable']:>10,} {row['step_ms']:>9.1f} {row['tokens_per_s']:>10,.0f} "
            f"{row['samples_per_s']:>10,.1f} {row['model_flops_per_step'] / 1e9:>10.2f} "
            f"{row['achieved_flops_per_s'] / 1e9:>8.1f} {100 * row['mfu']:>5.1f}% {memory:>8}"
        )
        if has_hf:
            line += f" {row['speedup_vs_hf']:>5.2f}x" if "speedup_vs_hf" in row else f" {'1.00x':>6}"
        lines.append(line)
    if result["data_ms_per_batch"] is not None:
        lines.append(
            f"data: {result['data_ms_per_batch']:.2f} ms to generate one batch of {result['task']} "
            f"({100 * max(r['data_fraction'] for r in result['rows']):.1f}% of a step at most)"
        )
    lines += [f"note: {note}" for note in result["notes"]]
    return "\n".join(lines)


def format_profiles(result: dict[str, Any]) -> str:
    """The per-row profiles of a result made with `profile=True`, as text."""
    lines = []
    for row in result["rows"]:
        if "profile" not in row:
            continue
        lines += ["", f"{row['name']}: one step, operators by self time"]
        if "profile_summary" in row:
            summary = row["profile_summary"]
            lines.append(
                f"  GPU busy {summary['busy_ms']:.1f} ms of a {row['step_ms']:.1f} ms step (idle "
                f"{100 * summary['idle_share']:.0f}%), matrix products {summary['matmul_ms']:.1f} ms"
            )
        lines += [
            f"  {100 * op['share']:5.1f}%  {op['self_ms']:9.1f} ms  {op['calls']:5d} calls  {op['op']}"
            for op in row["profile"]
        ]
    return "\n".join(lines)


def bench_command(options: BenchOptions, progress: Callable[[str], None] | None = None) -> tuple[dict[str, Any], Path]:
    """Time training steps of each chosen variant at one model shape (median of repeats after warm-up), with tokens/s,
    peak memory and model FLOPs utilisation against this device's measured matmul peak, beside a Hugging Face
    Llama of the same shape; write the result as JSON.

    `progress` is called with a line of text as each phase starts. Returns the result and the file written.
    """
    out = options.out or Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    if out.exists():
        raise UsageError(f"{out} already exists; choose another --out")
    check_output_dir(out.parent)
    result = run_bench(shape_of(options), options, progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    return result, out


def shape_of(options: BenchOptions) -> Shape:
    """The shape `options` ask for: vocabulary and sequence length default to the task's, or 512 and 128."""
    if options.task_params and options.task is None:
        raise UsageError("task parameters need a task")
    seq, vocab = 128, 512
    if options.task is not None:
        made = make_task(options.task, options.task_params)
        seq, vocab = made.input_len, made.vocab_size
    return Shape(
        d_model=options.d_model,
        n_layers=options.n_layers,
        n_heads=options.n_heads,
        vocab_size=vocab if options.vocab_size is None else options.vocab_size,
        seq_len=seq if options.seq_len is None else options.seq_len,
        batch_size=options.batch_size,
    )
