"""`mixit analyze RUN_DIR`: every analysis of a trained run, written to RUN_DIR/analysis/.

    head_scores.json / .png     previous-token, induction, duplicate-token scores per layer and
                                head, and the in-context gap on repeated random sequences
    attention.npz / .png        every head's pattern on one input (a test example by default)
    fixed_patterns.npz / .png   the input-independent matrices (MixiT models only)
    signal.json                 token similarity after each layer, trained and at initialisation
    summary.md                  the strongest heads and the numbers above, in words

The files are derived from the run's checkpoint and are rewritten by each
`analyze`; nothing else in the run directory is touched.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixit.analysis.attention_maps import (attention_patterns, fixed_patterns, plot_pattern_grid,
                                           plot_score_tables)
from mixit.analysis.induction import head_scores, strongest
from mixit.analysis.signal import token_similarity
from mixit.errors import UsageError
from mixit.train import checkpoint as ckpt
from mixit.train.loop import build, resolve_device


def load_run(run_dir: Path, device: str = "auto"):
    """(cfg, task, model with the latest checkpoint loaded, checkpoint path) of a run directory."""
    if not run_dir.is_dir():
        raise UsageError(f"run directory {run_dir} does not exist")
    cfg = ckpt.load_config(run_dir)
    last = ckpt.latest_checkpoint(run_dir)
    if last is None:
        raise UsageError(f"{run_dir} has no checkpoint yet")
    task, model, _ = build(cfg, run_dir)
    ckpt.load_model_state(last, model)
    return cfg, task, model.to(resolve_device(device)), last


def analyze_run(run_dir: str | Path, device: str = "auto", example: int = 0, tokens: list[int] | None = None,
                batch: int = 64, seed: int = 0) -> dict[str, Any]:
    """Run every analysis on `run_dir`'s latest checkpoint; return what summary.md says."""
    run_dir = Path(run_dir)
    cfg, task, model, last = load_run(run_dir, device)
    test_inputs = task.test_batch().inputs
    if tokens is None:
        if not 0 <= example < len(test_inputs):
            raise UsageError(f"example must be in [0, {len(test_inputs)}), got {example}")
        x = test_inputs[example]
    else:
        x = torch.as_tensor(tokens, dtype=torch.long)
        bad = [t for t in tokens if not 0 <= t < cfg.model.vocab_size]
        if bad or not 1 <= len(tokens) <= cfg.model.n_ctx:
            raise UsageError(f"tokens must be 1..{cfg.model.n_ctx} ids in [0, {cfg.model.vocab_size}), "
                             f"got {len(tokens)} tokens" + (f" with out-of-range ids {bad[:5]}" if bad else ""))
    out_dir = run_dir / "analysis"
    out_dir.mkdir(exist_ok=True)
    name = f"{cfg.task}/{cfg.variant} ({run_dir.name}, {last.name})"

    scores = head_scores(model, task.analysis_tokens(), batch=batch, seed=seed)
    (out_dir / "head_scores.json").write_text(json.dumps(scores, indent=2) + "\n")
    plot_score_tables(scores, out_dir / "head_scores.png", f"head scores: {name}")

    patterns = attention_patterns(model, x)
    np.savez(out_dir / "attention.npz", patterns=patterns, tokens=x.numpy())
    plot_pattern_grid(patterns, out_dir / "attention.png", f"attention patterns: {name}",
                      labels=[str(t) for t in x.tolist()])
    fixed = fixed_patterns(model)
    if fixed is not None:
        np.savez(out_dir / "fixed_patterns.npz", patterns=fixed)
        plot_pattern_grid(fixed, out_dir / "fixed_patterns.png", f"fixed mixing matrices: {name}")

    probe = test_inputs[: min(len(test_inputs), batch)].to(next(model.parameters()).device)
    _, fresh, _ = build(cfg, run_dir)
    signal = {"trained": token_similarity(model, probe), "init": token_similarity(fresh.to(probe.device), probe)}
    (out_dir / "signal.json").write_text(json.dumps(signal, indent=2) + "\n")

    findings = summarize(scores, signal)
    (out_dir / "summary.md").write_text(render_summary(name, findings, fixed is not None))
    return findings


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
        "previous_token_below_induction": (None if feeder is None else
                                           {"layer": feeder[0], "head": feeder[1], "score": feeder[2]}),
        "icl": scores["icl"],
        "final_cosine": {"trained": signal["trained"]["cosine"][-1], "init": signal["init"]["cosine"][-1]},
    }


def render_summary(name: str, f: dict[str, Any], has_fixed: bool) -> str:
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
        lines.append(f"- Strongest previous-token head below the induction head: layer {feeder['layer']}, "
                     f"head {feeder['head']} (score {feeder['score']:.3f}).")
    lines.append(f"- Strongest duplicate-token head: layer {f['duplicate_token']['layer']}, head "
                 f"{f['duplicate_token']['head']} (score {f['duplicate_token']['score']:.3f}).")
    if icl is not None:
        lines.append(f"- In-context learning on repeated random sequences: next-token loss "
                     f"{icl['loss_first_copy']:.3f} on the first copy, {icl['loss_second_copy']:.3f} on the second "
                     f"(gap {icl['loss_gap']:.3f}); accuracy {icl['acc_first_copy']:.3f} -> "
                     f"{icl['acc_second_copy']:.3f}.")
    lines += [
        f"- Mean cosine similarity between token representations after the last layer: "
        f"{f['final_cosine']['trained']:.3f} trained, {f['final_cosine']['init']:.3f} at initialisation.",
        "",
        "Files: head_scores.json/.png, attention.npz/.png"
        + (", fixed_patterns.npz/.png (the MixiT matrices)" if has_fixed else "")
        + ", signal.json.",
        "",
    ]
    return "\n".join(lines)
