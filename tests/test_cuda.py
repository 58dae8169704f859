"""CUDA: every variant trains in fp32, bf16 and fp16; an interrupted fp32 run resumes bit for bit; autocast and
torch.compile compute the eager fp32 function within their dtype's precision; torchrun with nccl; the CLI's
train, eval and analyze on the GPU; `mixit bench` on the GPU.

These tests run only when selected: ``pytest -m cuda`` on a machine with a CUDA GPU (docs/performance.md, "On a
GPU"). The default run (``make test``, CI) deselects them (pyproject.toml's addopts). Selected on a machine
without a GPU they fail rather than skip, so that a GPU check never passes unrun.
"""

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from mixit import Run, build, run_config, train
from mixit.bench import BenchOptions, run_bench, shape_of
from mixit.cli import main
from mixit.core.freezing import VARIANTS
from mixit.core.precision import DTYPES, Precision
from tolerance import assert_close

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True)
def gpu():
    if not torch.cuda.is_available():
        pytest.fail("the cuda tests need a CUDA GPU; run `pytest -m cuda` on a machine with one")
    # fp32 means fp32: no TF32 matrix products, whatever the process set before.
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@pytest.fixture
def deterministic():
    """CUDA's deterministic kernels (embedding and index backward without atomics), as a bit-exact comparison
    needs; cuBLAS's workspace is fixed by tests/conftest.py before CUDA starts."""
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def addition(variant="standard", **kw):
    """2-digit addition at a size that learns in a few hundred GPU steps."""
    base = dict(d_model=64, n_heads=4, n_layers=2, steps=300, batch_size=256, test_size=500, eval_every=100)
    base.update(kw)
    return run_config("addition", variant, {"n_digits": 2}, **base)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64."""
    actual, expected = actual.double(), expected.double()
    return float((actual - expected).norm() / expected.norm())


def typical_terms(n_layers: int, d_model: int) -> float:
    """The roundings of a forward pass on the GPU, as tests/tolerance.py's `terms` but a typical count rather
    than a worst case: the unit roundoff (eps / 2) once per rounded product, summed over the products a layer
    chains (Q/K/V, scores, softmax, A V, output, gate and up, down: 7) and the head, each an inner product of
    d_model terms whose reduction order may change (a factor sqrt(d_model), the typical growth of independent
    roundings). RMSNorm keeps each layer's input at unit scale, so the errors add relative to it."""
    return (7 * n_layers + 1) * math.sqrt(d_model) / 2


def forward_bound(dtype: torch.dtype, n_layers: int, d_model: int) -> float:
    """A bound on the relative error of a forward pass whose products round to `dtype` (`typical_terms`)."""
    return torch.finfo(dtype).eps * typical_terms(n_layers, d_model)


def latest(run_dir, part):
    """The tensors of the latest checkpoint's model or optimizer state."""
    return load_file(str(Run.open(run_dir).latest_checkpoint() / f"{part}.safetensors"))


def eval_losses(run_dir):
    return [e["loss"] for e in Run.open(run_dir).metrics() if e["event"] == "eval"]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("variant", VARIANTS.names())
def test_every_variant_learns_in_every_dtype(tmp_path, variant, dtype):
    """The loss falls from chance (ln of the vocabulary) to below ln 10, the loss of a uniform guess among the
    ten digits of the answer: even the random transformer, which trains its embeddings only, learns that."""
    summary = train(addition(variant, dtype=dtype), tmp_path / "run", device="cuda", progress=False)
    losses = eval_losses(tmp_path / "run")
    assert summary["device"].startswith("cuda")
    assert all(math.isfinite(loss) for loss in losses), losses
    assert losses[0] > math.log(10) > losses[-1], losses


class Interrupt(Exception):
    pass


@pytest.mark.parametrize("variant", ["standard", "mixit"])
def test_an_interrupted_fp32_run_resumes_bit_for_bit(tmp_path, variant, deterministic):
    cfg = addition(variant, steps=60, eval_every=20, checkpoint_every=20)
    full = train(cfg, tmp_path / "full", device="cuda", progress=False)

    def stop(step, loss):
        if step == 50:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(cfg, tmp_path / "cut", device="cuda", progress=False, on_step=stop)
    resumed = train(cfg, tmp_path / "cut", device="cuda", resume=True, progress=False)
    assert resumed["resumed_from"] == 40
    assert resumed["test"] == full["test"]
    for part in ("model", "optimizer"):
        a, b = latest(tmp_path / "full", part), latest(tmp_path / "cut", part)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), part


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("variant", ["standard", "mixit"])
def test_autocast_forward_is_the_fp32_forward_within_the_dtypes_precision(gpu, variant, dtype):
    cfg = addition(variant)
    task, model, _ = build(cfg)
    model.to(gpu).eval()
    x = task.test_batch().inputs[:256].to(gpu)
    with torch.no_grad():
        exact = model(x)
        with Precision(dtype, gpu).autocast():
            reduced = model(x)
    assert reduced.dtype == DTYPES[dtype]
    m = cfg.model
    assert relative_error(reduced, exact) <= forward_bound(DTYPES[dtype], m.n_layers, m.d_model)


@pytest.mark.parametrize("variant", ["standard", "mixit"])
def test_compiled_forward_and_training_on_the_gpu(tmp_path, gpu, variant):
    cfg = addition(variant, steps=200)
    task, model, _ = build(cfg)
    model.to(gpu).eval()
    x = task.test_batch().inputs[:256].to(gpu)
    with torch.no_grad():
        eager, compiled = model(x), torch.compile(model)(x)
    m = cfg.model
    assert relative_error(compiled, eager) <= forward_bound(torch.float32, m.n_layers, m.d_model)
    # Trained compiled, the first step's loss (before any update) is the eager one's, and the run learns.
    first = {}
    for name, flag in (("eager", False), ("compiled", True)):
        train(
            cfg, tmp_path / name, device="cuda", compile=flag, progress=False,
            on_step=lambda step, loss, name=name: first.setdefault(name, loss),
        )  # fmt: skip
    assert_close(first["compiled"], first["eager"], dtype=torch.float32, terms=typical_terms(2, m.d_model))
    losses = eval_losses(tmp_path / "compiled")
    assert losses[0] > math.log(10) > losses[-1], losses


def test_torchrun_trains_with_nccl_as_one_process_does(tmp_path):
    args = ["train", "--task", "addition", "-p", "n_digits=2", "--d-model", "64", "--n-heads", "4"]
    args += ["--steps", "100", "--batch-size", "256", "--test-size", "500", "--device", "cuda", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m", "mixit"]
    done = subprocess.run(
        [*launcher, *args, "--out", str(tmp_path / "ddp")], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    ddp = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    one = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert ddp["device"].startswith("cuda") and ddp["world_size"] == 1
    # One rank under DDP averages its gradients over one replica: the same arithmetic as one process.
    assert_close(ddp["test"]["loss"], one["test"]["loss"], dtype=torch.float32, terms=typical_terms(2, 64))


def test_cli_trains_in_bf16_evaluates_and_analyses_on_the_gpu(tmp_path, capsys):
    run = str(tmp_path / "run")
    args = ["train", "--task", "induction", "-p", "length=32", "-p", "alphabet=8", "--d-model", "64"]
    args += ["--n-heads", "4", "--n-layers", "2", "--steps", "200", "--batch-size", "64", "--test-size", "200"]
    assert main([*args, "--dtype", "bf16", "--device", "cuda", "--no-progress", "--out", run]) == 0
    assert main(["eval", run, "--device", "cuda"]) == 0
    assert main(["analyze", run, "--device", "cuda"]) == 0
    assert Run.open(run).analysis.complete and Run.open(run).analysis.head_scores() is not None


def test_bench_on_the_gpu_in_bf16(gpu):
    options = BenchOptions(d_model=128, n_layers=2, n_heads=4, seq_len=64, batch_size=32, device="cuda", dtype="bf16")
    options = dataclasses.replace(options, warmup=2, steps=2, repeats=2, profile=True)
    result = run_bench(shape_of(options), options)
    names = [row["name"] for row in result["rows"]]
    assert names == [*VARIANTS.names(), "hf_llama"]
    assert result["device"].startswith("cuda") and result["dtype"] == "bf16"
    for row in result["rows"]:
        assert 0 < row["mfu"] <= 1, row  # against the peak measured in the same run
        assert row["peak_memory_mb"] > 0
        # The profile lists GPU kernels, not the operators that launch them (which would count them twice).
        assert not any(op["op"].startswith("aten::") for op in row["profile"]), row["profile"]
        assert 0 < row["profile_summary"]["matmul_ms"] <= row["profile_summary"]["busy_ms"]
