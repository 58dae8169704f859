"""`mixit analyze RUN_DIR`: every analysis of a trained run, written to RUN_DIR/analysis/.

    head_scores.json / .png     previous-token, induction, duplicate-token scores per layer and
                                head, and the in-context gap on repeated random sequences
    attention.npz / .png        every head's pattern on one input (a test example by default)
    fixed_patterns.npz / .png   the input-independent matrices (MixiT models only)
    signal.json                 token similarity after each layer, trained and at initialisation
    retrieval_by_pairs.json     retrieval runs only: test accuracy by the number of stored pairs
                                (the paper's Fig. 2)
    summary.md                  the strongest heads and the numbers above, in words

The files are derived from the run's checkpoint and are rewritten by each
`analyze`; nothing else in the run directory is touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixit.analysis.attention_maps import attention_patterns, fixed_patterns, plot_pattern_grid, plot_score_tables
from mixit.analysis.induction import head_scores, strongest
from mixit.analysis.signal import token_similarity
from mixit.config import check
from mixit.errors import UsageError
from mixit.experiment import build_model
from mixit.files import write_json, write_text
from mixit.run import Run
from mixit.tasks.base import Batch

BY_PAIRS = "retrieval_by_pairs.json"
"""The file of `retrieval_by_pairs` in a retrieval run's analysis directory."""


def analyze_run(
    run_dir: Path,
    device: str = "auto",
    example: int = 0,
    tokens: Sequence[int] | None = None,
    batch: int = 64,
    seed: int = 0,
) -> dict[str, Any]:
    """Run every analysis on a run's latest checkpoint and write RUN_DIR/analysis/.

    Returns the findings of summary.md as data, with the text itself under
    "summary" and the directory written under "out_dir".

    Args:
        run_dir: the run directory.
        device: auto, cpu, cuda or cuda:N.
        example: the test example whose attention maps are drawn.
        tokens: draw the attention maps of these token ids instead (comma-separated on the command line).
        batch: repeated random sequences for the head scores.
        seed: seed of those sequences.
    """
    check(batch > 0, f"batch must be a positive integer, got {batch}")
    run = Run.open(run_dir)
    loaded = run.load(device)
    cfg, task, model, last = loaded.cfg, loaded.task, loaded.model, loaded.checkpoint
    test_inputs = task.test_batch().inputs
    if tokens is None:
        if not 0 <= example < len(test_inputs):
            raise UsageError(f"example must be in [0, {len(test_inputs)}), got {example}")
        x = test_inputs[example]
    else:
        bad = [t for t in tokens if not 0 <= t < cfg.model.vocab_size]
        if bad or not 1 <= len(tokens) <= cfg.model.n_ctx:
            raise UsageError(
                f"tokens must be 1..{cfg.model.n_ctx} ids in [0, {cfg.model.vocab_size}), "
                f"got {len(tokens)} tokens" + (f" with out-of-range ids {bad[:5]}" if bad else "")
            )
        x = torch.as_tensor(list(tokens), dtype=torch.long)
    out_dir = run.analysis_dir
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir} exists and is not a directory")
    out_dir.mkdir(exist_ok=True)
    name = f"{cfg.task}/{cfg.variant} ({run.path.name}, {last.name})"

    scores = head_scores(model, task.analysis_tokens(), batch=batch, seed=seed)
    write_json(out_dir / "head_scores.json", scores)
    plot_score_tables(scores, out_dir / "head_scores.png", f"head scores: {name}")

    patterns = attention_patterns(model, x)
    np.savez(out_dir / "attention.npz", patterns=patterns, tokens=x.numpy())
    plot_pattern_grid(
        patterns, out_dir / "attention.png", f"attention patterns: {name}", labels=[str(t) for t in x.tolist()]
    )
    fixed = fixed_patterns(model)
    if fixed is not None:
        np.savez(out_dir / "fixed_patterns.npz", patterns=fixed)
        plot_pattern_grid(fixed, out_dir / "fixed_patterns.png", f"fixed mixing matrices: {name}")

    probe = test_inputs[: min(len(test_inputs), batch)].to(next(model.parameters()).device)
    fresh, _ = build_model(cfg)
    signal = {"trained": token_similarity(model, probe), "init": token_similarity(fresh.to(probe.device), probe)}
    write_json(out_dir / "signal.json", signal)

    files = []
    if cfg.task == "retrieval":  # the only task whose examples vary in how much they store
        by_pairs = retrieval_by_pairs(model, task.test_batch(), batch)
        write_json(out_dir / BY_PAIRS, by_pairs)
        files.append(BY_PAIRS)

    findings = summarize(scores, signal)
    text = render_summary(name, findings, fixed is not None, files)
    write_text(out_dir / "summary.md", text)
    return {**findings, "summary": text, "out_dir": str(out_dir)}


@torch.no_grad()
def retrieval_by_pairs(model: torch.nn.Module, batch: Batch, chunk: int = 500) -> dict[str, dict[str, float]]:
    """Accuracy of a retrieval model on `batch`, by the number of stored pairs: {k: {"accuracy": fraction
    right, "examples": n}}, k as a string (JSON keys).

    An example with k pairs asks at position 2k, the only scored one (docs/tasks.md, "retrieval")."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    preds = torch.cat(
        [model(batch.inputs[i : i + chunk].to(device)).argmax(-1).cpu() for i in range(0, len(batch), chunk)]
    )  # (N, L-1)
    model.train(was_training)
    position = batch.mask.float().argmax(dim=1)[:, None]  # (N, 1) the scored position
    right = (preds.gather(1, position) == batch.targets.gather(1, position))[:, 0]  # (N,)
    pairs = position[:, 0] // 2  # (N,)
    return {
        str(k): {"accuracy": right[pairs == k].float().mean().item(), "examples": int((pairs == k).sum())}
        for k in pairs.unique().tolist()
    }


def summarize(scores: dict[str, Any], signal: dict[str, Any]) -> dict[str, Any]:
    ind_layer, ind_head, ind = strongest(scores["induction"])
    prev_layer, prev_head, prev = strongest(scores["previous_token"])
    dup_layer, dup_head, dup = strongest(scores["duplicate_token"])
    # The previous-token head an induction head would read from sits in a lower layer.
    below = scores["previous_token"][:ind_layer]
    feeder = strongest(below) if below else None
    return {
        "induction": {"layer": ind_layer, "head": ind_head, "score": ind},
        "previous_token": {"layer": prev_layer, "head": prev_head, "score": prev},
        "duplicate_token": {"layer": dup_layer, "head": dup_head, "score": dup},
        "previous_token_below_induction": (
            None if feeder is None else {"layer": feeder[0], "head": feeder[1], "score": feeder[2]}
        ),
        "icl": scores["icl"],
        "final_cosine": {"trained": signal["trained"]["cosine"][-1], "init": signal["init"]["cosine"][-1]},
    }


def render_summary(name: str, f: dict[str, Any], has_fixed: bool, files: Sequence[str] = ()) -> str:
    icl = f["icl"]
    lines = [
        f"# Analysis of {name}",
        "",
        f"- Strongest induction head: layer {f['induction']['layer']}, head {f['induction']['head']} "
        f"(score {f['induction']['score']:.3f}; 1 = all attention on the token after the previous occurrence).",
        f"- Strongest previous-token head: layer {f['previous_token']['layer']}, head "
        f"{f['previous_token']['head']} (score {f['previous_token']['score']:.3f}).",
    ]
    feeder = f["previous_token_below_induction"]
    if feeder is not None:
        lines.append(
            f"- Strongest previous-token head below the induction head: layer {feeder['layer']}, "
            f"head {feeder['head']} (score {feeder['score']:.3f})."
        )
    lines.append(
        f"- Strongest duplicate-token head: layer {f['duplicate_token']['layer']}, head "
        f"{f['duplicate_token']['head']} (score {f['duplicate_token']['score']:.3f})."
    )
    if icl is not None:
        lines.append(
            f"- In-context learning on repeated random sequences: next-token loss "
            f"{icl['loss_first_copy']:.3f} on the first copy, {icl['loss_second_copy']:.3f} on the second "
            f"(gap {icl['loss_gap']:.3f}); accuracy {icl['acc_first_copy']:.3f} -> "
            f"{icl['acc_second_copy']:.3f}."
        )
    lines += [
        f"- Mean cosine similarity between token representations after the last layer: "
        f"{f['final_cosine']['trained']:.3f} trained, {f['final_cosine']['init']:.3f} at initialisation.",
        "",
        "Files: head_scores.json/.png, attention.npz/.png"
        + (", fixed_patterns.npz/.png (the MixiT matrices)" if has_fixed else "")
        + ", signal.json"
        + "".join(f", {file}" for file in files)
        + ".",
        "",
    ]
    return "\n".join(lines)
