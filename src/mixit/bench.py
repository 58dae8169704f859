"""`mixit bench`: training throughput, peak memory and model FLOPs utilisation (docs/performance.md).

Each variant at one shape, and a Hugging Face Llama of that shape, trains on a fixed random batch with the
training loop's own step. Times come from torch.utils.benchmark, FLOPs from FlopCounterMode, MFU is against a
square matmul timed in the same run, and peak memory is CUDA's allocator peak or Linux's VmHWM. Rows are timed
round-robin, block by block, so a slow spell of a shared machine lands on all alike (torch.utils.benchmark times
one statement at a time).
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import itertools
import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.utils.benchmark import Measurement, Timer
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from mixit.core.config import ModelConfig, TrainConfig, typed
from mixit.core.experiment import model_config
from mixit.core.freezing import VARIANTS, apply_variant
from mixit.core.models import Transformer
from mixit.core.precision import DTYPES, Precision
from mixit.core.resources import activation_bytes, check_memory, model_bytes
from mixit.core.tasks import make_task
from mixit.core.training.optim import build_optimizer
from mixit.core.training.step import train_step
from mixit.errors import UsageError
from mixit.export import llama_config
from mixit.files import check_output_dir, write_json
from mixit.runtime import release_free_memory, resolve_device
from mixit.version import __version__, git_commit, install_hint

aten = torch.ops.aten
HF_NAME = "hf_llama"
PEAK_NAME = "matmul_peak"


@dataclasses.dataclass(frozen=True)
class Shape:
    """The model size and the batch one step trains on (`shape_of` reads it from BenchOptions)."""

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


@dataclasses.dataclass
class Contender:
    """One row to time: a zero-argument training step and what it is."""

    name: str
    step: Callable[[], Any]
    flops: int
    n_trainable: int
    n_params: int
    peak_memory_mb: float | None = None  # measured by `run_bench` during the warm-up


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(
    contenders: Sequence[Contender], device: torch.device, steps: int, repeats: int
) -> dict[str, Measurement]:
    """`repeats` blocks of `steps` calls of each contender (one `Timer.timeit` each), block r of every contender
    before block r + 1 of any: one Measurement per contender, its `times` the seconds per call of each block."""

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
    """One product of two n x n matrices in `dtype` as a step to time: the device's dense matmul throughput,
    against which MFU is computed."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(device=device, dtype=dtype) for _ in range(2))
    return Contender(PEAK_NAME, lambda: a @ b, 2 * n**3, 0, 0)


def _memory_mb(device: torch.device, peak: bool) -> float | None:
    """CUDA: memory allocated now, or its peak since the last reset. Linux: the resident set now (VmRSS) or its
    peak (VmHWM). None elsewhere."""
    if device.type == "cuda":
        return (torch.cuda.max_memory_allocated if peak else torch.cuda.memory_allocated)(device) / 2**20
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    field = "VmHWM:" if peak else "VmRSS:"
    return next(int(line.split()[1]) / 1024 for line in status.read_text().splitlines() if line.startswith(field))


def _memory_baseline(device: torch.device) -> float | None:
    """Restart the peak count and return the memory held now (`_memory_mb`)."""
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
    """Where one step's time goes: the `top` operators of torch.profiler by self time, with call counts and shares
    of the total, then the rest together. On a GPU the kernels (their operators would count the time twice)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        contender.step()
        _sync(device)
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [
        e
        for e in prof.key_averages()
        if getattr(e, attr) > 0
        # on a GPU, kernels only: no operator, no range such as the optimizer's step
        and not (cuda and (e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False)))
    ]
    events.sort(key=lambda e: getattr(e, attr), reverse=True)
    total = sum(getattr(e, attr) for e in events)

    def entry(op: str, group: list[Any]) -> dict[str, Any]:
        spent = sum(getattr(e, attr) for e in group)
        return {"op": op, "self_ms": spent / 1e3, "calls": sum(e.count for e in group), "share": spent / total}

    rest = events[top:]
    return [entry(e.key, [e]) for e in events[:top]] + ([entry(f"({len(rest)} others)", rest)] if rest else [])


def profile_summary(profile: list[dict[str, Any]], step_ms: float) -> dict[str, float]:
    """A GPU profile in three numbers: the device's busy time in one step, its part in matrix products
    (`MATMUL_KERNELS`, among the kernels listed), and the share of the timed step it sat waiting for the host."""
    busy = sum(op["self_ms"] for op in profile)
    matmul = sum(op["self_ms"] for op in profile if any(k in op["op"].lower() for k in MATMUL_KERNELS))
    return {"busy_ms": busy, "matmul_ms": matmul, "idle_share": max(0.0, 1 - busy / step_ms)}


def _contender(
    name: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    shape: Shape,
    precision: Precision,
    compile: bool,
    logits: Callable[[Any], torch.Tensor] = lambda output: output,
) -> Contender:
    """`model` trained by mixit's step on a fixed random batch, `logits` reading its output. FLOPs are counted
    over one eager step (FlopCounterMode does not see into compiled kernels), which trains the model by one step."""
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randint(shape.vocab_size, (shape.batch_size, shape.seq_len), generator=g) for _ in range(2))
    x, y = x.to(precision.device), y.to(precision.device)  # (B, T) each

    def step(forward: Callable[..., Any]) -> torch.Tensor:
        return train_step(lambda t: logits(forward(t)), optimizer, x, y, trainable, TrainConfig.grad_clip, precision)

    flops = count_flops(partial(step, model))
    n_trainable = sum(p.numel() for p in trainable)
    n_params = sum(p.numel() for p in model.parameters())
    return Contender(name, partial(step, torch.compile(model) if compile else model), flops, n_trainable, n_params)


def bench_variant(variant: str, shape: Shape, precision: Precision, compile: bool = False) -> Contender:
    """`variant` at `shape` with mixit's optimizer, in `precision` (the row's own: an fp16 scaler adapts to one
    model)."""
    model = Transformer(shape.model_config(variant))
    apply_variant(model, variant)
    optimizer = build_optimizer(model.to(precision.device), TrainConfig(), precision.device)
    return _contender(variant, model, optimizer, shape, precision, compile)


def bench_hf(shape: Shape, precision: Precision, compile: bool = False) -> Contender:
    """The baseline: the LlamaForCausalLM that mixit's standard model of `shape` exports to (`llama_config`; SDPA,
    no cache), through mixit's step with a plain torch.optim.AdamW of the same hyperparameters, all trained."""
    from transformers import LlamaForCausalLM

    config = llama_config(shape.model_config("standard"))
    config.use_cache, config._attn_implementation = False, "sdpa"
    with torch.random.fork_rng(devices=[]):  # Hugging Face initialises from the global generator: leave it be
        torch.manual_seed(0)
        model: torch.nn.Module = LlamaForCausalLM(config)
    model.to(precision.device)
    tc = TrainConfig()
    betas = (tc.beta1, tc.beta2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.lr, betas=betas, weight_decay=tc.weight_decay)
    return _contender(HF_NAME, model, optimizer, shape, precision, compile, lambda output: output.logits)


def data_seconds(task_name: str, task_params: dict[str, Any], batch_size: int) -> float:
    """Median seconds to generate a new training batch of `task_name` as the training loop does."""
    task = make_task(task_name, task_params)
    timer = Timer(
        "task.train_batch(next(index), size)",
        globals={"task": task, "index": itertools.count(), "size": batch_size},
        num_threads=torch.get_num_threads(),
    )
    return timer.blocked_autorange(min_run_time=0.1).median


def _checked_device(shape: Shape, options: BenchOptions) -> torch.device:
    """The device to run on, after refusing what cannot be benchmarked there (rows that do not fit included)."""
    if not options.variants:
        raise UsageError(f"no variant given; allowed: {', '.join(VARIANTS)}")
    for variant in options.variants:
        VARIANTS.get(variant)
    if options.dtype not in DTYPES:
        raise UsageError(f"unknown dtype {options.dtype!r}; allowed: {', '.join(DTYPES)}")
    for name in ("warmup", "steps", "repeats"):
        if typed(name, int, getattr(options, name)) < 1:
            raise UsageError(f"{name} must be an integer >= 1, got {getattr(options, name)!r}")
    dev = resolve_device(options.device)
    if options.dtype != "fp32" and dev.type != "cuda":
        raise UsageError(
            f"dtype {options.dtype} (autocast) is offered on cuda only; on this CPU fp32 is many times faster"
        )
    # Every row is built before the timing, so all models and their optimizer state are held at once; a step's
    # activations are freed when it ends, so one row's are held at a time.
    cfg = shape.model_config("standard")
    n_rows = len(options.variants) + int(options.baseline)
    needed = {
        f"{n_rows} models with their optimizer state": n_rows * 4 * model_bytes(cfg),
        "one step's activations": activation_bytes(cfg, shape.batch_size, shape.seq_len),
    }
    advice = "lower the batch size, the sequence length, the model's size or the number of variants"
    check_memory("this benchmark", needed, dev, advice)
    return dev


def run_bench(shape: Shape, options: BenchOptions, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Benchmark `options.variants` (and the Hugging Face baseline) at `shape_of(options)`: a JSON-serialisable
    dict of the environment, the matmul peak, one row per model and, with a task, the time to generate a batch.
    `progress` is called with a line of text as each phase starts."""
    dev = _checked_device(shape, options)
    say = progress or (lambda message: None)
    data_s = None if options.task is None else data_seconds(options.task, options.task_params or {}, shape.batch_size)
    builders = {
        v: partial(bench_variant, v, shape, Precision(options.dtype, dev), options.compile) for v in options.variants
    }
    notes = []
    if options.baseline and importlib.util.find_spec("transformers") is None:
        notes.append(f"transformers is not installed: no Hugging Face baseline row ({install_hint('bench')} to add it)")
    elif options.baseline:
        builders[HF_NAME] = partial(bench_hf, shape, Precision(options.dtype, dev), options.compile)
    contenders = []
    for name, build in builders.items():
        say(f"building and warming up {name}")
        before = _memory_baseline(dev)
        contender = build()  # counts its FLOPs with an eager step, before the peak measured below
        _memory_baseline(dev)  # restarts the peak count; what was held before building stays the baseline
        for _ in range(options.warmup):
            contender.step()
        after = _memory_mb(dev, peak=True)
        contender.peak_memory_mb = None if before is None or after is None else after - before
        contenders.append(contender)

    peak_n = 8192 if dev.type == "cuda" else 2048
    matmul = matmul_contender(dev, DTYPES[options.dtype] or torch.float32, peak_n)
    say(f"timing {len(contenders)} rows and the matmul round-robin, {options.repeats} blocks of {options.steps} steps")
    timed = time_interleaved([matmul, *contenders], dev, options.steps, options.repeats)
    peak = {
        "n": peak_n,
        "best_flops_per_s": matmul.flops / min(timed[PEAK_NAME].times),
        "median_flops_per_s": matmul.flops / timed[PEAK_NAME].median,
    }
    rows = []
    for c in contenders:
        step_s = timed[c.name].median
        row: dict[str, Any] = {
            "name": c.name,
            "n_trainable": c.n_trainable,
            "n_params": c.n_params,
            "step_ms": 1e3 * step_s,
            "step_ms_iqr": 1e3 * timed[c.name].iqr,
            "step_ms_all": [1e3 * t for t in timed[c.name].times],
            "steps_per_s": 1 / step_s,
            "samples_per_s": shape.batch_size / step_s,
            "tokens_per_s": shape.tokens / step_s,
            "model_flops_per_step": c.flops,
            "achieved_flops_per_s": c.flops / step_s,
            "mfu": c.flops / step_s / peak["best_flops_per_s"],
            "peak_memory_mb": c.peak_memory_mb,
        }
        if HF_NAME in timed and c.name != HF_NAME:
            row["speedup_vs_hf"] = timed[HF_NAME].median / step_s  # tokens/s over the baseline's
        if data_s is not None:
            row["data_fraction"] = data_s / (data_s + step_s)  # the share of a step generating its batch would take
        if options.profile:
            say(f"profiling one step of {c.name}")
            row["profile"] = profile_step(c, dev)
            if dev.type == "cuda":
                row["profile_summary"] = profile_summary(row["profile"], row["step_ms"])
        rows.append(row)
    return {
        "shape": dataclasses.asdict(shape),
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev)
        if dev.type == "cuda"
        else f"{os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads",
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


COLUMNS: list[tuple[str, int, Callable[[dict[str, Any]], str]]] = [
    ("trainable", 10, lambda row: f"{row['n_trainable']:,}"),
    ("step ms", 9, lambda row: f"{row['step_ms']:.1f}"),
    ("tokens/s", 10, lambda row: f"{row['tokens_per_s']:,.0f}"),
    ("samples/s", 10, lambda row: f"{row['samples_per_s']:,.1f}"),
    ("GFLOP/step", 10, lambda row: f"{row['model_flops_per_step'] / 1e9:.2f}"),
    ("GFLOP/s", 8, lambda row: f"{row['achieved_flops_per_s'] / 1e9:.1f}"),
    ("MFU", 6, lambda row: f"{100 * row['mfu']:.1f}%"),
    ("peak MB", 8, lambda row: "-" if row["peak_memory_mb"] is None else f"{row['peak_memory_mb']:.0f}"),
]
"""The table's columns after the row's name: header, width, and the cell of a row (right-aligned)."""
VS_HF = ("vs HF", 6, lambda row: f"{row.get('speedup_vs_hf', 1.0):.2f}x")
"""The column of speed-ups over the Hugging Face row, shown where there is one (which reads 1.00x)."""


def format_table(result: dict[str, Any]) -> str:
    """The result as a fixed-width text table with a header line."""
    s = result["shape"]
    lines = [
        f"mixit bench: d_model {s['d_model']}, {s['n_layers']} layers, {s['n_heads']} heads, vocab "
        f"{s['vocab_size']}, seq {s['seq_len']}, batch {s['batch_size']}; {result['device_name']}, "
        f"{result['dtype']}{', compiled' if result['compile'] else ''}; "
        f"matmul peak {result['peak']['best_flops_per_s'] / 1e9:.1f} GFLOP/s"
    ]
    columns = COLUMNS + ([VS_HF] if any("speedup_vs_hf" in row for row in result["rows"]) else [])
    lines.append(f"{'variant':<11} " + " ".join(f"{header:>{width}}" for header, width, _ in columns))
    for row in result["rows"]:
        lines.append(f"{row['name']:<11} " + " ".join(f"{cell(row):>{width}}" for _, width, cell in columns))
    if result["data_ms_per_batch"] is not None:
        lines.append(
            f"data: {result['data_ms_per_batch']:.2f} ms to generate one batch of {result['task']} "
            f"({100 * max(r['data_fraction'] for r in result['rows']):.1f}% of a step at most)"
        )
    return "\n".join(lines + [f"note: {note}" for note in result["notes"]])


def format_profiles(result: dict[str, Any]) -> str:
    """The per-row profiles of a result made with `profile=True`, as text."""
    lines = []
    for row in (row for row in result["rows"] if "profile" in row):
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
