"""`mixit analyze RUN_DIR`: every analysis of a trained run, written to RUN_DIR/analysis/ (its files are listed
in `mixit.core.run`), with summary.md, the findings in words; a retrieval run's accuracy by number of stored pairs
is the paper's Fig. 2. Each `analyze` rewrites those files and touches nothing else; every checkpoint is read
before the first file is written, so a damaged one leaves analysis/ as it was. An exported model is analysed the
same way, into the directory of --out.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixit.analysis.attention_maps import (
    attention_patterns,
    fixed_patterns,
    plot_over_time,
    plot_pattern_grid,
    plot_score_tables,
)
from mixit.analysis.induction import SCORE_KINDS, head_scores, strongest
from mixit.analysis.signal import token_similarity
from mixit.core.checkpoint import load_model_state
from mixit.core.config import ModelConfig, check
from mixit.core.models import Transformer
from mixit.core.run import Analysis, Loaded, Run
from mixit.core.tasks.base import Batch
from mixit.core.training.evaluate import evaluate
from mixit.core.training.loop import ACCURACIES
from mixit.errors import UsageError
from mixit.export import holds_export, load, locate
from mixit.files import check_output_dir


def analyze_run(
    run_dir: Path,
    device: str = "auto",
    example: int = 0,
    tokens: Sequence[int] | None = None,
    batch: int = 64,
    seed: int = 0,
    over_time: bool = False,
    out: Path | None = None,
) -> dict[str, Any]:
    """Run every analysis on a run's latest checkpoint, or on an exported model, and write the results to
    RUN_DIR/analysis/ (or --out).

    Returns the findings of summary.md (`summarize`), its text under "summary" and the directory under "out_dir".

    Args:
        run_dir: The run directory, a directory written by `mixit export` (--to hf or hub), or the Hub repo id
            of one. An export is analysed with the task its config records, and is never written into.
        device: Where to run: auto (cuda if available, else cpu), cpu, cuda or cuda:N.
        example: The index of the test example whose attention maps are drawn.
        tokens: Draw the attention maps of these token ids instead of a test example (comma-separated on the
            command line); null means the test example.
        batch: Repeated random sequences the head scores are measured on.
        seed: Seed of those random sequences.
        over_time: Also score the heads and evaluate the test set at every checkpoint the run holds, into
            over_time.json and over_time.png (train with --keep-checkpoints log to keep about 20 of them); a run
            directory's only, since an export holds its final weights alone.
        out: The directory to write the files into; null means RUN_DIR/analysis, for a run directory only (an
            export needs it).
    """
    check(batch > 0, f"batch must be a positive integer, got {batch}")
    path, run, analysis = analysis_target(run_dir, out, over_time)
    check_output_dir(analysis.path)  # before any computing
    loaded = load(path, device)
    model, task = loaded.model, loaded.task
    test_inputs = task.test_batch().inputs
    x = pattern_input(test_inputs, loaded.cfg.model, example, tokens)
    # Every checkpoint is read (a damaged one refused) before anything is written into analysis/.
    history = over_time_history(run, loaded, batch, seed) if over_time and run is not None else None
    analysis.prepare()
    label = f"{loaded.cfg.task}/{loaded.cfg.variant}"
    name = f"{label} ({Path(run_dir).name}, {loaded.checkpoint.name})"

    scores = head_scores(model, task.analysis_tokens(), batch=batch, seed=seed)
    analysis.write("head_scores", scores)
    plot_score_tables(scores, analysis.figure_path("head_scores"), f"head scores: {name}")
    patterns = attention_patterns(model, x)
    token_names = task.token_names()
    labels = [token_names[t] for t in x.tolist()]
    analysis.write_arrays("attention", patterns=patterns, tokens=x.numpy(), names=np.array(labels, dtype=str))
    plot_pattern_grid(patterns, analysis.figure_path("attention"), f"attention patterns: {name}", labels=labels)
    fixed = fixed_patterns(model)
    if fixed is not None:
        analysis.write_arrays("fixed_patterns", patterns=fixed)
        plot_pattern_grid(fixed, analysis.figure_path("fixed_patterns"), f"fixed mixing matrices: {name}")
    probe = test_inputs[:batch].to(next(model.parameters()).device)
    # A fresh model is the run's as initialised: what the variant froze changes no forward pass.
    fresh = Transformer(loaded.cfg.model).to(probe.device)
    signal = {"trained": token_similarity(model, probe), "init": token_similarity(fresh, probe)}
    analysis.write("signal", signal)
    files = []
    if loaded.cfg.task == "retrieval":  # the only task whose examples vary in how much they store
        files.append(analysis.write("retrieval_by_pairs", retrieval_by_pairs(model, task.test_batch(), batch)).name)

    findings = summarize(scores, signal)
    if history is not None:
        metric = history["metric"]
        plot_over_time(
            history["steps"],
            {kind: [h["score"] for h in history["strongest"][kind]] for kind in SCORE_KINDS},
            {f"test {metric}": [t[metric] for t in history["test"]]},
            f"{label} ({Path(run_dir).name}): strongest head against step",
            analysis.figure_path("over_time"),
        )
        findings["over_time"] = over_time_line(history)
        files += [analysis.write("over_time", history).name, analysis.figure_path("over_time").name]
    text = render_summary(name, findings, fixed is not None, files)
    analysis.write_summary(text)
    return {**findings, "summary": text, "out_dir": str(analysis.path)}


def analysis_target(run_dir: Path, out: Path | None, over_time: bool) -> tuple[Path, Run | None, Analysis]:
    """What `analyze_run` reads and writes: the directory `run_dir` names, its run (None for an export, which is
    never written into and holds no checkpoints to analyse over time), and the analysis directory."""
    path = locate(run_dir)
    run = None if holds_export(path) else Run.open(path)
    if run is None and over_time:
        raise UsageError(
            f"--over-time needs a run's checkpoints, and {run_dir} is an exported model, which holds its final "
            "weights alone: analyse the run directory it was exported from"
        )
    if out is not None:
        return path, run, Analysis(Path(out))
    if run is None:
        raise UsageError(
            f"{run_dir} is an exported model, whose directory is left as exported: give --out DIR for the "
            "analysis, or analyse the run directory it was exported from"
        )
    return path, run, run.analysis


def pattern_input(
    test_inputs: torch.Tensor, cfg: ModelConfig, example: int, tokens: Sequence[int] | None
) -> torch.Tensor:
    """The input whose attention patterns are drawn: test input `example`, or `tokens` (checked against
    the model's vocabulary and context) -> (T,) ids."""
    if tokens is None:
        if not 0 <= example < len(test_inputs):
            raise UsageError(f"example must be in [0, {len(test_inputs)}), got {example}")
        return test_inputs[example]
    bad = [t for t in tokens if not 0 <= t < cfg.vocab_size]
    if bad or not 1 <= len(tokens) <= cfg.n_ctx:
        raise UsageError(
            f"tokens must be 1..{cfg.n_ctx} ids in [0, {cfg.vocab_size}), "
            f"got {len(tokens)} tokens" + (f" with out-of-range ids {bad[:5]}" if bad else "")
        )
    return torch.as_tensor(list(tokens), dtype=torch.long)


def over_time_history(run: Run, loaded: Loaded, batch: int, seed: int) -> dict[str, Any]:
    """over_time.json: the head scores and the test metrics at every checkpoint `run` holds, nothing written. The
    model of `loaded` is loaded with each checkpoint in turn, and with its own again at the end."""
    steps = run.checkpoints()
    model, task = loaded.model, loaded.task
    scores, tests = [], []
    for step in steps:
        load_model_state(model, run.checkpoint(step))
        scores.append(head_scores(model, task.analysis_tokens(), batch=batch, seed=seed))
        tests.append(evaluate(model, task, next(model.parameters()).device, loaded.cfg.train.eval_batch_size))
    load_model_state(model, loaded.checkpoint)
    return {
        "steps": steps,
        "metric": next((m for m in ACCURACIES if m in tests[-1]), "loss"),
        "test": tests,
        "strongest": {kind: [strongest(s[kind]) for s in scores] for kind in SCORE_KINDS},
        "scores": {kind: [s[kind] for s in scores] for kind in SCORE_KINDS},
        "icl_gap": [None if s["icl"] is None else s["icl"]["loss_gap"] for s in scores],
        "probe": scores[-1]["probe"],
    }


def over_time_line(history: dict[str, Any]) -> str:
    """One line on how the strongest induction head and the test metric changed over the checkpoints."""
    steps, metric = history["steps"], history["metric"]
    induction = [h["score"] for h in history["strongest"]["induction"]]
    test = [t[metric] for t in history["test"]]
    line = (
        f"Over training ({len(steps)} checkpoint{'s' if len(steps) != 1 else ''}, steps {steps[0]}-{steps[-1]}): "
        f"strongest induction score {induction[0]:.3f} -> {induction[-1]:.3f}"
    )
    rise, i = max(((induction[i] - induction[i - 1], i) for i in range(1, len(steps))), default=(0.0, 0))
    if round(rise, 3) > 0:  # where a phase change would show
        line += f" (largest rise, {rise:+.3f}, between steps {steps[i - 1]} and {steps[i]})"
    return line + f"; test {metric} {test[0]:.3f} -> {test[-1]:.3f}."


@torch.no_grad()
def retrieval_by_pairs(model: torch.nn.Module, batch: Batch, chunk: int = 500) -> dict[str, dict[str, float]]:
    """Accuracy of a retrieval model on `batch` by the number of stored pairs: {str(k): {"accuracy", "examples"}}.
    An example with k pairs asks at position 2k, the only scored one (docs/tasks.md, "retrieval")."""
    device = next(model.parameters()).device
    preds = torch.cat(
        [model(batch.inputs[i : i + chunk].to(device)).argmax(-1).cpu() for i in range(0, len(batch), chunk)]
    )  # (N, L-1)
    position = batch.mask.float().argmax(dim=1)[:, None]  # (N, 1) the scored position
    right = (preds.gather(1, position) == batch.targets.gather(1, position))[:, 0]  # (N,)
    pairs = position[:, 0] // 2  # (N,)
    return {
        str(k): {"accuracy": right[pairs == k].float().mean().item(), "examples": int((pairs == k).sum())}
        for k in pairs.unique().tolist()
    }


def summarize(scores: dict[str, Any], signal: dict[str, Any]) -> dict[str, Any]:
    """The findings of summary.md from head_scores.json (`scores`) and signal.json (`signal`)."""
    findings: dict[str, Any] = {
        kind: strongest(scores[kind]) for kind in ("induction", "previous_token", "duplicate_token")
    }
    # The previous-token head an induction head would read from sits in a lower layer.
    below = scores["previous_token"][: findings["induction"]["layer"]]
    return {
        **findings,
        "previous_token_below_induction": strongest(below) if below else None,
        "icl": scores["icl"],
        # None for an analysis written before the input dependence was measured.
        "pattern_input_dependence": scores.get("pattern_input_dependence"),
        "pattern_scale": scores.get("pattern_scale"),
        "final_cosine": {"trained": signal["trained"]["cosine"][-1], "init": signal["init"]["cosine"][-1]},
    }


def render_summary(name: str, f: dict[str, Any], has_fixed: bool, files: Sequence[str] = ()) -> str:
    """summary.md of `name` from its findings `f` (`summarize`), naming the files written beside it."""

    def head(label: str, h: dict[str, Any], note: str = "") -> str:
        return f"- Strongest {label}: layer {h['layer']}, head {h['head']} (score {h['score']:.3f}{note})."

    lines = [
        f"# Analysis of {name}",
        "",
        head("induction head", f["induction"], "; 1 = all attention on the token after the previous occurrence"),
        head("previous-token head", f["previous_token"]),
    ]
    if f["previous_token_below_induction"] is not None:
        lines.append(head("previous-token head below the induction head", f["previous_token_below_induction"]))
    lines.append(head("duplicate-token head", f["duplicate_token"]))
    if (icl := f["icl"]) is not None:
        lines.append(
            f"- In-context learning on repeated random sequences: next-token loss "
            f"{icl['loss_first_copy']:.3f} on the first copy, {icl['loss_second_copy']:.3f} on the second "
            f"(gap {icl['loss_gap']:.3f}); accuracy {icl['acc_first_copy']:.3f} -> "
            f"{icl['acc_second_copy']:.3f}."
        )
    if f.get("pattern_input_dependence") is not None:
        lines.append(
            f"- Attention patterns on two different probe batches differ by at most "
            f"{f['pattern_input_dependence']:.3g} (largest |weight| {f['pattern_scale']:.3g}; 0 = the attention "
            "does not depend on the input)."
        )
    lines += [
        f"- Mean cosine similarity between token representations after the last layer: "
        f"{f['final_cosine']['trained']:.3f} trained, {f['final_cosine']['init']:.3f} at initialisation.",
        *([f"- {f['over_time']}"] if f.get("over_time") else []),
        "",
        "Files: head_scores.json/.png, attention.npz/.png"
        + (", fixed_patterns.npz/.png (the input-independent patterns)" if has_fixed else "")
        + ", signal.json"
        + "".join(f", {file}" for file in files)
        + ".",
        "",
    ]
    return "\n".join(lines)
