"""Training: schedule, a short run that learns, checkpoints, exact resumption, run-directory guards."""

import itertools
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from mixit import Run, build, run_config, train
from mixit.core.checkpoint import load_model_state, save_checkpoint
from mixit.core.config import TrainConfig
from mixit.core.training.loop import log_spaced_steps
from mixit.errors import UsageError
from tolerance import assert_close, assert_trained_alike, training_terms


def tiny_cfg(**kw):
    base = dict(
        task_params={"n_digits": 2},
        d_model=32,
        n_heads=2,
        n_layers=1,
        steps=30,
        batch_size=32,
        test_size=200,
        eval_every=10,
        checkpoint_every=10,
        log_every=5,
    )
    base.update(kw)
    params = base.pop("task_params")
    task = base.pop("task", "addition")
    variant = base.pop("variant", "standard")
    return run_config(task, variant, params, **base)


def load_latest(run_dir, model):
    run = Run.open(run_dir)
    load_model_state(model, run.latest_checkpoint())


def latest_weights(run_dir):
    return load_file(str(Run.open(run_dir).latest_checkpoint() / "model.safetensors"))


def test_lr_schedule_warmup_then_cosine_to_floor():
    cfg = TrainConfig(steps=110, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert cfg.lr_at(0) == pytest.approx(0.1)
    assert cfg.lr_at(9) == pytest.approx(1.0)
    assert cfg.lr_at(10) == pytest.approx(1.0)
    assert cfg.lr_at(59.5) == pytest.approx(0.55)  # halfway through the cosine
    assert cfg.lr_at(109) == pytest.approx(0.1)


def test_linear_and_constant_schedules():
    linear = TrainConfig(steps=110, lr=1.0, warmup_steps=10, min_lr_ratio=0.1, schedule="linear")
    assert [linear.lr_at(s) for s in (10, 59.5, 109)] == pytest.approx([1.0, 0.55, 0.1])
    assert linear.lr_at(34.75) == pytest.approx(0.775)  # a quarter of the way: linear, not cosine
    constant = TrainConfig(steps=110, lr=1.0, warmup_steps=10, schedule="constant")
    assert [constant.lr_at(s) for s in (0, 10, 109)] == pytest.approx([0.1, 1.0, 1.0])


def test_run_config_uses_task_defaults_and_overrides():
    cfg = run_config("addition", "mixit", {"n_digits": 5}, lr=0.002)
    assert cfg.model.attention == "mixing"
    assert cfg.model.vocab_size == 31 and cfg.model.n_ctx == 3 * 5 + 4  # the whole example, as the reference
    assert cfg.train.lr == 0.002
    with pytest.raises(UsageError, match="unknown option"):
        run_config("addition", "standard", None, learning_rate=1.0)


def test_short_run_learns_memorization(tmp_path):
    # 64 (x, y) -> label pairs; a 1-layer model memorises them in 150 steps.
    cfg = run_config(
        "memorization",
        "standard",
        {"n": 8},
        d_model=64,
        n_heads=2,
        n_layers=1,
        steps=150,
        batch_size=64,
        lr=1e-2,
        eval_every=150,
    )
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["test"]["token_acc"] >= 0.95
    assert summary["test"]["bits"] == pytest.approx(summary["test"]["token_acc"] * 64 * math.log2(8))


def test_short_run_learns_two_digit_addition(tmp_path):
    cfg = run_config(
        "addition",
        "standard",
        {"n_digits": 2},
        d_model=64,
        n_heads=4,
        n_layers=2,
        steps=400,
        batch_size=128,
        lr=3e-3,
        test_size=500,
        eval_every=400,
    )
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["test"]["exact_match"] >= 0.9, summary["test"]


def test_run_directory_contents(tmp_path):
    cfg = tiny_cfg()
    train(cfg, tmp_path / "run", progress=False)
    run = tmp_path / "run"
    saved = json.loads((run / "config.json").read_text())
    assert saved["config"] == cfg.to_dict() and saved["mixit_version"]
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "eval"] == [0, 10, 20, 30]  # step 0: before training
    assert events[0]["event"] == "freeze"
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_0000030"
    assert [p.name for p in (run / "checkpoints").iterdir() if p.is_dir()] == ["step_0000030"]
    summary = json.loads((run / "summary.json").read_text())
    last_eval = [e for e in events if e["event"] == "eval"][-1]
    assert summary["test"] == {k: v for k, v in last_eval.items() if k not in ("step", "event") and k[:4] != "val_"}
    assert summary["val"] == {k[4:]: v for k, v in last_eval.items() if k[:4] == "val_"}
    assert summary["steps"] == 30 and summary["convergence"]["steps_trained"] == 30


def test_checkpoint_reload_gives_identical_logits(tmp_path):
    cfg = tiny_cfg(variant="mixit", steps=10, checkpoint_every=10)
    train(cfg, tmp_path / "run", progress=False)
    task, trained, _ = build(cfg)
    load_latest(tmp_path / "run", trained)
    # A model built with another seed has other weights and other MixiT buffers; loading restores both.
    other_cfg = run_config("addition", "mixit", {"n_digits": 2}, d_model=32, n_heads=2, n_layers=1, seed=7)
    _, other, _ = build(other_cfg)
    assert not torch.equal(other.blocks[0].attn.mixing, trained.blocks[0].attn.mixing)
    load_latest(tmp_path / "run", other)
    x = task.test_batch().inputs[:16]
    assert torch.equal(other.eval()(x), trained.eval()(x))
    assert torch.equal(other.blocks[0].attn.mixing, trained.blocks[0].attn.mixing)


def _evals(run_dir):
    """The eval events of metrics.jsonl: step -> (test metrics, validation metrics)."""
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        e["step"]: (
            {k: v for k, v in e.items() if k not in ("step", "event") and k[:4] != "val_"},
            {k[4:]: v for k, v in e.items() if k[:4] == "val_"},
        )
        for e in events
        if e["event"] == "eval"
    }


def test_summary_selects_the_evaluation_with_the_best_validation_metric(tmp_path):
    # At lr 0.05 the validation token accuracy peaks at step 20 (0.399) and ends lower (0.386 at step 30).
    cfg = tiny_cfg(lr=0.05, eval_every=5, val_size=200)
    summary = train(cfg, tmp_path / "run", progress=False)
    evals = _evals(tmp_path / "run")
    best = max(evals[s][1]["token_acc"] for s in evals)
    step = min(s for s in evals if evals[s][1]["token_acc"] == best)  # the earliest of equals
    assert summary["selected"] == {"step": step, "test": evals[step][0], "val": evals[step][1]}
    assert step != 30 and summary["test"] == evals[30][0]  # "test" stays the last evaluation's
    assert summary["convergence"]["best_step"] == step


def test_a_resumed_run_selects_from_the_evaluations_before_its_resume_too(tmp_path):
    cfg = tiny_cfg(lr=0.05, eval_every=5, val_size=200)
    full = train(cfg, tmp_path / "full", progress=False)

    def stop(step, loss):
        if step == 25:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(cfg, tmp_path / "cut", progress=False, on_step=stop)
    resumed = train(cfg, tmp_path / "cut", resume=True, progress=False)
    assert resumed["resumed_from"] == 20 and full["selected"]["step"] <= 20  # read back from metrics.jsonl
    assert resumed["selected"] == full["selected"]


class Interrupt(Exception):
    pass


@pytest.mark.parametrize(
    "stop_at, steps, latest",
    [(25, 30, "step_0000020"), (5, 20, None)],  # after a checkpoint; before the first (resumes from step 0)
)
def test_resume_continues_from_saved_step_and_matches_uninterrupted_run(tmp_path, stop_at, steps, latest):
    cfg = tiny_cfg(steps=steps, checkpoint_every=10)
    full = train(cfg, tmp_path / "full", progress=False)

    def stop(step, loss):
        if step == stop_at:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(cfg, tmp_path / "cut", progress=False, on_step=stop)
    pointer = tmp_path / "cut" / "checkpoints" / "latest"
    assert (pointer.read_text().strip() if pointer.exists() else None) == latest
    resumed = train(cfg, tmp_path / "cut", resume=True, progress=False)
    assert resumed["resumed_from"] == (int(latest.split("_")[1]) if latest else 0)
    assert resumed["test"] == full["test"]
    a, b = latest_weights(tmp_path / "full"), latest_weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps_logged = [
        json.loads(line)["step"]
        for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "train"
    ]
    assert steps_logged == sorted(set(steps_logged)) and steps_logged[-1] == steps  # no step logged twice


def test_log_spaced_steps_by_hand():
    assert log_spaced_steps(1) == [1]
    assert log_spaced_steps(30) == [1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 15, 18, 21, 25, 30]
    long = log_spaced_steps(100_000)
    assert len(long) == 20 and long[:4] == [1, 2, 3, 6] and long[-1] == 100_000
    assert all(1.7 < b / a < 2.0 for a, b in itertools.pairwise(long[5:]))  # a constant ratio, 100000 ** (1/19)


@pytest.mark.parametrize(
    "keep, held",
    [("latest", [30]), ("all", [10, 20, 30]), ("log", [1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 15, 18, 21, 25, 30])],
)
def test_keep_checkpoints_keeps_what_it_says_and_changes_no_result(tmp_path, keep, held):
    cfg = tiny_cfg(steps=30, checkpoint_every=10)
    reference = train(cfg, tmp_path / "reference", progress=False)
    summary = train(cfg, tmp_path / "run", progress=False, keep_checkpoints=keep)
    run = Run.open(tmp_path / "run")
    assert run.checkpoints() == held
    assert run.latest_checkpoint() == run.checkpoint(30)
    assert summary["test"] == reference["test"]
    a, b = latest_weights(tmp_path / "reference"), latest_weights(tmp_path / "run")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == json.loads(
        (tmp_path / "reference" / "config.json").read_text()
    )


def test_resume_keeps_what_was_kept_and_stays_exact(tmp_path):
    """A log run killed at step 24 (just after the cadence's checkpoint 24, not a kept one) and resumed with
    the default (latest) ends with the weights of an uninterrupted run and every log checkpoint."""
    cfg = tiny_cfg(steps=30, checkpoint_every=4)
    full = train(cfg, tmp_path / "full", progress=False, keep_checkpoints="log")

    def stop(step, loss):
        if step == 24:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(cfg, tmp_path / "cut", progress=False, keep_checkpoints="log", on_step=stop)
    cut = Run.open(tmp_path / "cut")
    assert cut.checkpoints() == [1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 15, 18, 21, 24]  # 24: the newest, for resume
    assert cut.latest_checkpoint() == cut.checkpoint(24)
    before = {s: (cut.checkpoint(s) / "model.safetensors").read_bytes() for s in (1, 10, 21)}
    resumed = train(cfg, tmp_path / "cut", resume=True, progress=False)
    assert resumed["resumed_from"] == 24 and resumed["test"] == full["test"]
    assert cut.checkpoints() == [1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 15, 18, 21, 30]  # the session kept no new ones
    assert all((cut.checkpoint(s) / "model.safetensors").read_bytes() == data for s, data in before.items())
    a, b = latest_weights(tmp_path / "full"), latest_weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_load_a_kept_checkpoint(tmp_path):
    cfg = tiny_cfg(steps=30, checkpoint_every=10)
    train(cfg, tmp_path / "run", progress=False, keep_checkpoints="log")
    run = Run.open(tmp_path / "run")
    early, late, default = run.load("cpu", step=2), run.load("cpu", step=30), run.load("cpu")
    assert early.checkpoint.name == "step_0000002" and default.checkpoint == late.checkpoint
    x = early.task.test_batch().inputs[:8]
    assert torch.equal(late.model.eval()(x), default.model.eval()(x))
    assert not torch.equal(early.model.eval()(x), late.model(x))
    with pytest.raises(UsageError, match=r"no checkpoint of step 8; it holds steps: 1, 2, 3, .*, 25, 30"):
        run.load("cpu", step=8)


def test_a_kept_checkpoint_is_never_removed_by_a_save(tmp_path):
    cfg = tiny_cfg(steps=10, checkpoint_every=10)
    train(cfg, tmp_path / "run", progress=False, keep_checkpoints="all")
    run = Run.open(tmp_path / "run")
    _, model, _ = build(cfg)
    from mixit.core.training.optim import build_optimizer

    optimizer = build_optimizer(model, cfg.train, torch.device("cpu"))
    stray = run.checkpoint(10)
    kept = (stray / "model.safetensors").read_bytes()
    save_checkpoint(run.checkpoints_dir, 10, model, optimizer)  # a kept checkpoint of the same step is left as it is
    assert (stray / "model.safetensors").read_bytes() == kept
    save_checkpoint(run.checkpoints_dir, 11, model, optimizer)
    save_checkpoint(run.checkpoints_dir, 12, model, optimizer)  # removes 11, not kept
    assert run.checkpoints() == [10, 12] and run.latest_checkpoint() == run.checkpoint(12)


def test_keep_checkpoints_is_refused_when_unknown(tmp_path):
    with pytest.raises(UsageError, match="keep_checkpoints must be one of latest, all, log, got 'some'"):
        train(tiny_cfg(), tmp_path / "run", progress=False, keep_checkpoints="some")
    assert not (tmp_path / "run").exists()


def test_guards_on_the_run_directory(tmp_path):
    cfg = tiny_cfg(steps=10)
    train(cfg, tmp_path / "run", progress=False)
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    with pytest.raises(UsageError, match="already holds a run"):
        train(cfg, tmp_path / "run", progress=False)
    with pytest.raises(UsageError, match=r"holds a different run.*d_model: 32 != 64"):
        train(tiny_cfg(steps=10, d_model=64), tmp_path / "run", resume=True, progress=False)
    after = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    assert before == after

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty and holds no mixit run"):
        train(cfg, foreign, progress=False)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    with pytest.raises(UsageError, match=r"run directory .*nothing does not exist"):
        train(cfg, tmp_path / "nothing", resume=True, progress=False)


def test_corrupt_checkpoint_is_a_usage_error(tmp_path):
    cfg = tiny_cfg(steps=10)
    train(cfg, tmp_path / "run", progress=False)
    run = Run.open(tmp_path / "run")
    path = run.latest_checkpoint()
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    _, model, _ = build(cfg)
    with pytest.raises(UsageError, match="corrupt or unreadable"):
        load_model_state(model, path)


def test_sequence_longer_than_n_ctx_is_refused(tmp_path):
    with pytest.raises(UsageError, match="longer than n_ctx=5"):
        tiny_cfg(n_ctx=5)


@pytest.mark.parametrize("variant", ["standard", "mixit"])
def test_compiled_training_matches_eager(tmp_path, variant):
    """torch.compile changes how the step is computed, not what: the same run
    compiled ends within float tolerance of the eager one."""
    cfg = tiny_cfg(variant=variant, steps=5, eval_every=5, checkpoint_every=5)
    eager = train(cfg, tmp_path / "eager", progress=False)
    compiled = train(cfg, tmp_path / "compiled", progress=False, compile=True)
    # Compiled kernels fuse and order the steps' arithmetic otherwise: the runs train alike (tests/tolerance.py), and
    # their test losses differ by those roundings on the scale of a uniform guess's loss, about where training started.
    terms, scale = training_terms(cfg), math.log(cfg.model.vocab_size)
    assert_close(compiled["test"]["loss"], eager["test"]["loss"], dtype=torch.float32, terms=terms, scale=scale)
    a, b = build(cfg)[1], build(cfg)[1]
    load_latest(tmp_path / "eager", a)
    load_latest(tmp_path / "compiled", b)
    assert_trained_alike(b.state_dict(), a.state_dict(), cfg)
