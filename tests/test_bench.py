"""`mixit bench`: the FLOP counts by hand, the rows it reports, the command and its bad input.

The FLOPs and the times come from torch's own FlopCounterMode and torch.utils.benchmark, run for real here.

No assertion here is about speed: throughput targets are checked with
`mixit bench` itself (docs/performance.md), never in timed tests.
"""

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from mixit.bench import BenchOptions, Shape, bench_hf, bench_variant, count_flops, format_table, run_bench
from mixit.cli import main
from mixit.core.config import ModelConfig
from mixit.core.freezing import VARIANTS, apply_variant
from mixit.core.models import Transformer
from mixit.core.precision import Precision
from mixit.errors import UsageError

# d 8, 1 layer, 2 heads (d_head 4), vocab 10, 2 sequences of 4 tokens: 8 tokens, 4 x 4 = 16 query-key pairs.
TINY = Shape(d_model=8, n_layers=1, n_heads=2, vocab_size=10, seq_len=4, batch_size=2)
# in*out of each linear: q, k, v, o 64 each; gate, up 8*32; down 32*8; LM head 8*10.
QK, VO, MLP, HEAD = 128, 128, 768, 80
# One product over every query-key pair of every head: 2 FLOPs per multiply-add * batch 2 * 16 pairs * d 8 (heads
# times d_head). Softmax attention (SDPA) does 7: Q K^T and A V forward; backward recomputes Q K^T and forms the
# gradients of A, V, Q and K. MixiT's fixed A does 2: A V forward and the gradient of V.
PAIRS = 2 * 2 * 16 * 8
CPU = Precision("fp32", torch.device("cpu"))


def tiny_model(variant: str) -> Transformer:
    model = Transformer(
        ModelConfig(vocab_size=10, n_ctx=4, d_model=8, n_layers=1, n_heads=2, attention=VARIANTS[variant].attention)
    )
    apply_variant(model, variant)
    return model


@pytest.mark.parametrize(
    "variant, expected",
    [
        # 2 FLOPs per multiply-add * 8 tokens * in*out, times 3 (forward, input grad, weight grad) if trained,
        # else 2 (a frozen weight's gradient is never computed); then the attention's products.
        ("standard", 16 * 3 * (QK + VO + MLP + HEAD) + 7 * PAIRS),
        ("frozen_qk", 16 * 2 * QK + 16 * 3 * (VO + MLP + HEAD) + 7 * PAIRS),
        ("frozen_mlp", 16 * 2 * MLP + 16 * 3 * (QK + VO + HEAD) + 7 * PAIRS),
        ("mixit", 16 * 3 * (VO + MLP + HEAD) + 2 * PAIRS),
        ("random", 16 * 2 * (QK + VO + MLP) + 16 * 3 * HEAD + 7 * PAIRS),
    ],
)
def test_step_flops_by_hand(variant, expected):
    """FlopCounterMode over one real training step of each variant counts what a hand count of its matmuls gives."""
    assert bench_variant(variant, TINY, CPU).flops == expected


def test_cpu_attention_is_counted():
    """CPU SDPA forward and backward count as the CUDA kernel's formula does (torch alone counts them as 0)."""
    q, k, v = (torch.randn(2, 2, 4, 4, requires_grad=True) for _ in range(3))  # (B, H, T, d_head): PAIRS per product
    assert count_flops(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()) == 7 * PAIRS


def test_hf_baseline_has_the_standard_models_matmuls():
    llama = bench_hf(TINY, CPU)
    assert llama.flops == bench_variant("standard", TINY, CPU).flops
    assert llama.n_params == llama.n_trainable == sum(p.numel() for p in tiny_model("standard").parameters())


def test_run_bench_rows_are_consistent():
    options = BenchOptions(device="cpu", warmup=1, steps=1, repeats=2, task="addition", task_params={"n_digits": 2})
    result = run_bench(TINY, options)
    names = [row["name"] for row in result["rows"]]
    assert names[:5] == list(VARIANTS)
    peak = result["peak"]["best_flops_per_s"]
    assert peak >= result["peak"]["median_flops_per_s"] > 0
    for row in result["rows"]:
        step_s = row["step_ms"] / 1e3
        assert len(row["step_ms_all"]) == 2 and min(row["step_ms_all"]) <= row["step_ms"] <= max(row["step_ms_all"])
        assert row["step_ms_iqr"] == pytest.approx((max(row["step_ms_all"]) - min(row["step_ms_all"])) / 2)
        assert 0 < row["mfu"] <= 1
        assert row["tokens_per_s"] == pytest.approx(TINY.tokens / step_s)
        assert row["samples_per_s"] == pytest.approx(TINY.batch_size / step_s)
        assert row["mfu"] == pytest.approx(row["model_flops_per_step"] / step_s / peak)
        assert 0 < row["data_fraction"] < 1
    assert result["data_ms_per_batch"] > 0
    rows = {row["name"]: row for row in result["rows"]}
    assert rows["mixit"]["n_trainable"] == rows["mixit"]["n_params"]
    assert rows["frozen_qk"]["n_trainable"] == rows["standard"]["n_trainable"] - (QK + 2 * 8)  # q, k weights and biases
    if "hf_llama" in rows:
        for name in VARIANTS:
            assert rows[name]["speedup_vs_hf"] == pytest.approx(
                rows[name]["tokens_per_s"] / rows["hf_llama"]["tokens_per_s"]
            )
    else:
        assert "transformers is not installed" in result["notes"][0]
    table = format_table(result)
    assert all(name in table for name in names) and "matmul peak" in table
    json.dumps(result)


def test_table_puts_each_cell_under_its_header():
    """One value per column, formatted as a reader checks by hand; the Hugging Face row reads 1.00x against itself."""
    row = {"name": "mixit", "n_trainable": 1234567, "step_ms": 12.34, "tokens_per_s": 5000.4, "samples_per_s": 39.06}
    row |= {"model_flops_per_step": 2.5e9, "achieved_flops_per_s": 2.026e11, "mfu": 0.5, "peak_memory_mb": None}
    hf = {**row, "name": "hf_llama", "peak_memory_mb": 1500.4}
    result = {"shape": dataclasses.asdict(TINY), "device_name": "2 CPU cores", "dtype": "fp32", "compile": True}
    result |= {"peak": {"best_flops_per_s": 4.05e11}, "rows": [row | {"speedup_vs_hf": 1.234}, hf]}
    result |= {"data_ms_per_batch": None, "notes": ["a note"]}
    assert format_table(result).splitlines() == [
        "mixit bench: d_model 8, 1 layers, 2 heads, vocab 10, seq 4, batch 2; 2 CPU cores, fp32, compiled; "
        "matmul peak 405.0 GFLOP/s",
        "variant      trainable   step ms   tokens/s  samples/s GFLOP/step  GFLOP/s    MFU  peak MB  vs HF",
        "mixit        1,234,567      12.3      5,000       39.1       2.50    202.6  50.0%        -  1.23x",
        "hf_llama     1,234,567      12.3      5,000       39.1       2.50    202.6  50.0%     1500  1.00x",
        "note: a note",
    ]


def test_bench_step_trains_the_model():
    """The benchmarked step is the training step: the loss it reports on its fixed batch (before its update) falls."""
    step = bench_variant("mixit", TINY, CPU).step
    losses = [step().item() for _ in range(21)]
    assert losses[-1] < losses[0] - 0.1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"variants": ["nope"]}, "unknown variant 'nope'"),
        ({"variants": []}, "no variant given; allowed: standard, frozen_qk"),
        ({"dtype": "fp8"}, "unknown dtype 'fp8'; allowed: fp32, bf16, fp16"),
        ({"dtype": "fp16", "device": "cpu"}, "fp16 .* cuda only"),
        ({"dtype": "bf16", "device": "cpu"}, "bf16 .* cuda only"),
        ({"repeats": 0}, "repeats must be an integer >= 1"),
        ({"warmup": 0}, "warmup must be an integer >= 1"),
    ],
)
def test_run_bench_bad_input(kwargs, message):
    with pytest.raises(UsageError, match=message):
        run_bench(TINY, BenchOptions(**{"device": "cpu", **kwargs}))


def test_shape_bad_input():
    with pytest.raises(UsageError, match="n_heads must divide d_model: d_model=8 is not a multiple of n_heads=3"):
        Shape(d_model=8, n_heads=3)
    with pytest.raises(UsageError, match="batch_size must be a positive integer"):
        Shape(batch_size=0)


SMALL = [
    "bench",
    "--d-model",
    "8",
    "--n-layers",
    "1",
    "--n-heads",
    "2",
    "--batch-size",
    "2",
    "--warmup",
    "1",
    "--steps",
    "1",
    "--repeats",
    "1",
    "--no-baseline",
    "--variants",
    "standard,mixit",
]


def test_bench_command_prints_a_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main([*SMALL, "--task", "addition", "-p", "n_digits=2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "standard" in printed and "mixit" in printed and "MFU" in printed and "data:" in printed
    result = json.loads(out.read_text())
    assert result["shape"]["seq_len"] == 9 and result["shape"]["vocab_size"] == 31  # 2-digit addition
    assert [row["name"] for row in result["rows"]] == ["standard", "mixit"]
    before = out.read_bytes()
    assert main([*SMALL, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already exists; choose another --out" in err and len(err.strip().splitlines()) == 1
    assert out.read_bytes() == before


def test_bench_profile_names_the_operators_of_each_row(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main([*SMALL, "--profile", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    for row in result["rows"]:
        ops = {op["op"] for op in row["profile"]}
        assert any("mm" in op for op in ops)  # the matmuls are there
        assert sum(op["share"] for op in row["profile"]) <= 1 + 1e-9
        assert f"{row['name']}: one step, operators by self time" in printed
    assert any("scaled_dot_product" in op["op"] for op in result["rows"][0]["profile"])  # standard: SDPA
    assert not any("scaled_dot_product" in op["op"] for op in result["rows"][1]["profile"])  # mixit: none


@pytest.mark.parametrize(
    "args, message",
    [
        (["--variants", "standard,nope"], "unknown variant 'nope'; allowed: standard, frozen_qk"),
        (["--n-heads", "3"], "n_heads must divide d_model: d_model=8 is not a multiple of n_heads=3"),
        (["-p", "n_digits=2"], "-p/--task-param needs --task"),
        (["--task", "nope"], "unknown task"),
        (["--device", "tpu"], "unknown device 'tpu'"),
    ],
)
def test_bench_command_bad_input(args, message, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main([*SMALL, *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_timed_blocks_are_interleaved():
    """Block r of every contender runs before block r + 1 of any; each block is Timer.timeit's two untimed calls
    and then the `steps` timed ones."""
    from mixit.bench import Contender, time_interleaved

    calls = []
    contenders = [Contender(name, lambda name=name: calls.append(name), 1, 1, 1) for name in "ab"]
    timed = time_interleaved(contenders, torch.device("cpu"), steps=2, repeats=3)
    assert calls == ["a"] * 4 + ["b"] * 4 + ["a"] * 4 + ["b"] * 4 + ["a"] * 4 + ["b"] * 4
    assert list(timed) == ["a", "b"] and [len(m.times) for m in timed.values()] == [3, 3]


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/clear_refs").exists(), reason="Linux /proc only")
def test_peak_memory_counts_what_is_allocated_after_the_baseline():
    from mixit.bench import _memory_baseline, _memory_mb
    from mixit.runtime import tune_allocator

    tune_allocator()  # as the mixit command runs: freed heap is kept, and the baseline must not count it
    scratch = torch.ones(64, 2**20 // 4)  # 64 MiB, touched
    del scratch
    cpu = torch.device("cpu")
    before = _memory_baseline(cpu)
    block = torch.ones(48, 2**20 // 4)  # 48 MiB
    used = _memory_mb(cpu, peak=True) - before
    del block
    assert 44 <= used <= 60


def test_memory_check_counts_every_rows_model_but_one_steps_activations(monkeypatch):
    """All rows are held at once, but a step's activations are freed when it ends: at the GPU shape d 1024,
    12 layers, batch 64 x 256, six rows' activations (about 140 GiB estimated) would refuse an 80 GiB card that
    holds the six models and one step easily."""
    from mixit import bench
    from mixit.core.resources import activation_bytes, model_bytes

    shape = Shape(d_model=1024, n_layers=12, n_heads=16, vocab_size=512, seq_len=256, batch_size=64)
    cfg = shape.model_config("standard")
    rows = len(VARIANTS.names()) + 1
    needed = rows * 4 * model_bytes(cfg) + activation_bytes(cfg, 64, 256)
    assert rows * activation_bytes(cfg, 64, 256) > 80 * 2**30 > needed
    options = BenchOptions(d_model=1024, n_layers=12, n_heads=16, seq_len=256, device="cpu")
    monkeypatch.setattr("mixit.core.resources.available_memory", lambda device: needed)
    assert bench._checked_device(shape, options) == torch.device("cpu")  # exactly enough: accepted
    monkeypatch.setattr("mixit.core.resources.available_memory", lambda device: needed - 1)
    with pytest.raises(UsageError, match="this benchmark needs about"):
        bench._checked_device(shape, options)
