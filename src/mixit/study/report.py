"""The report of a study (`mixit report STUDY_DIR`): report.md, results.csv and figures.

report.md has one table per paper table (variant rows, metric columns, mean
and spread over seeds, the paper's number beside ours), the learning curves
and scaling plots, and every finding of the paper as a check, PASS or FAIL,
with the numbers behind it (`CHECKS`). results.csv has one row per run: its
id, state, labels, every config field and every test metric. A check whose
runs are missing or failed reads n/a.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixit.analysis.report import summarize
from mixit.files import read_json, write_text
from mixit.run import Run
from mixit.study.executors import load_study_record, run_dir, state
from mixit.version import __version__, git_commit

# The paper's numbers (arXiv 2506.01115 v3; docs/model.md, "The paper's numbers"), in percent or nats.
PAPER: dict[tuple[str, str, str], float] = {
    ("retrieval", "standard", "accuracy"): 100.0,
    ("retrieval", "frozen_qk", "accuracy"): 97.0,
    ("retrieval", "mixit", "accuracy"): 11.2,
    ("induction", "standard", "accuracy"): 99.99,
    ("induction", "frozen_qk", "accuracy"): 96.7,
    ("induction", "mixit", "accuracy"): 48.6,
    ("lm:wikitext-103", "standard", "loss"): 2.78,
    ("lm:wikitext-103", "frozen_qk", "loss"): 3.07,
    ("lm:wikitext-103", "mixit", "loss"): 3.73,
    ("lm:fineweb-edu", "standard", "loss"): 3.05,
    ("lm:fineweb-edu", "frozen_qk", "loss"): 3.16,
    ("lm:fineweb-edu", "mixit", "loss"): 4.08,
    ("memorization", "standard", "bits/param"): 2.98,
    ("memorization", "frozen_qk", "bits/param"): 2.25,
    ("memorization", "mixit", "bits/param"): 2.18,
    ("memorization", "frozen_mlp", "bits/param"): 1.13,
    ("sentiment:yelp_polarity", "standard", "accuracy"): 90.55,
    ("sentiment:yelp_polarity", "mixit", "accuracy"): 92.56,
}

HEADLINE = {  # task -> (column name, metric key, scale): the accuracy a task is judged by
    "addition": ("accuracy", "token_acc", 100),
    "dyck": ("accuracy", "token_acc", 100),
    "modular_addition": ("accuracy", "token_acc", 100),
    "memorization": ("accuracy", "token_acc", 100),
    "retrieval": ("accuracy", "token_acc", 100),
    "induction": ("accuracy", "token_acc", 100),
    "sentiment": ("accuracy", "accuracy", 100),
    "lm": ("loss", "loss", 1),
}
EXTRA_COLUMNS = {  # task -> further metrics shown
    "addition": [("exact match", "exact_match", 100)],
    "dyck": [("majority", "majority_baseline", 100)],
    "memorization": [("bits/param", "bits_per_trainable_param", 1), ("bits", "bits", 1)],
    "induction": [("answered acc", "answered_acc", 100)],
    "sentiment": [("majority", "majority_baseline", 100)],
    "lm": [("perplexity", "perplexity", 1), ("unigram loss", "unigram_loss", 1)],
}


@dataclass
class Result:
    """One run of the study as the report sees it."""

    id: str
    labels: list[dict[str, Any]]
    config: dict[str, Any]
    state: str
    test: dict[str, float]
    curve: list[tuple[int, float]]  # (step, headline metric) at each evaluation
    heads: dict[str, Any] | None  # analyze_run's findings, if analysed
    seconds: float | None
    error: str | None


def collect(study_dir: Path) -> tuple[dict[str, Any], list[Result]]:
    """The study's record and every run's results (what exists of them)."""
    record = load_study_record(study_dir)
    results = []
    for entry in record["runs"]:
        path = run_dir(study_dir, entry["id"])
        s = state(study_dir, entry["id"])
        test, curve, heads, seconds, error = {}, [], None, None, None
        task = entry["config"]["task"]
        _, key, scale = HEADLINE.get(task, ("accuracy", "token_acc", 100))
        if s == "done":
            run = Run.open(path)
            summary = run.summary() or {}
            test, seconds = summary.get("test", {}), summary.get("train_seconds_this_session")
            curve = [(e["step"], scale * e[key]) for e in run.metrics() if e.get("event") == "eval" and key in e]
            scores = path / "analysis" / "head_scores.json"
            if scores.exists():
                signal = read_json(path / "analysis" / "signal.json", "analysis signal.json")
                heads = summarize(read_json(scores, "head_scores.json"), signal)
        elif s == "failed":
            error = read_json(study_dir / "failed" / f"{entry['id']}.json", "a failure record").get("error")
        results.append(Result(entry["id"], entry["labels"], entry["config"], s, test, curve, heads, seconds, error))
    return record, results


# -- aggregation -----------------------------------------------------------------------------------


def _rows(results: Sequence[Result], **match: Any) -> list[tuple[Result, dict[str, Any]]]:
    """(result, labels) for every label set of every result that matches `match`."""
    return [(r, labels) for r in results for labels in r.labels if all(labels.get(k) == v for k, v in match.items())]


def values(results: Sequence[Result], metric: str, scale: float = 1.0, **match: Any) -> list[float]:
    """The metric of every finished run matching `match` (one value per seed)."""
    return [scale * r.test[metric] for r, _ in _rows(results, **match) if r.state == "done" and metric in r.test]


def mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def fmt(xs: Sequence[float], digits: int = 1) -> str:
    """mean ± sample std over seeds (n), or '-'."""
    if not xs:
        return "-"
    text = f"{statistics.fmean(xs):.{digits}f}"
    if len(xs) > 1:
        text += f" ± {statistics.stdev(xs):.{digits}f}"
    return text


def task_key(task: str, config: dict[str, Any]) -> str:
    """The paper's name of a task's dataset: lm and sentiment by their corpus."""
    params = config["task_params"]
    if task == "lm":
        return f"lm:{Path(params['corpus']).name}"
    if task == "sentiment":
        return f"sentiment:{Path(params['dataset']).name}"
    return task


def variant_table(results: Sequence[Result], table: str, task: str, variants: Sequence[str], **match: Any) -> str:
    """A markdown table: one row per variant, the task's metrics, the paper's number beside ours."""
    column, key, scale = HEADLINE[task]
    extra = EXTRA_COLUMNS.get(task, [])
    rows = _rows(results, table=table, task=task, **match)
    if not rows:
        return ""
    name = task_key(task, rows[0][0].config)
    digits = 3 if scale == 1 else 1
    header = ["variant", column, "paper", *(c for c, _, _ in extra), "runs"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for variant in variants:
        n = len(_rows(results, table=table, task=task, variant=variant, **match))
        if n == 0:  # a variant this table does not train
            continue
        got = values(results, key, scale, table=table, task=task, variant=variant, **match)
        paper = PAPER.get((name, variant, column))
        cells = [variant, fmt(got, digits), "-" if paper is None else f"{paper:g}"]
        for extra_column, k, s in extra:
            cell = fmt(values(results, k, s, table=table, task=task, variant=variant, **match), 3 if s == 1 else 1)
            theirs = PAPER.get((name, variant, extra_column))
            cells.append(cell + (f" (paper {theirs:g})" if theirs is not None else ""))
        cells.append(f"{len(got)}/{n}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- checks ------------------------------------------------------------------------------------


@dataclass
class Check:
    name: str
    verdict: str  # PASS, FAIL or n/a
    evidence: str


def _acc(results: Sequence[Result], table: str, task: str, variant: str, **match: Any) -> float | None:
    _, key, scale = HEADLINE[task]
    return mean(values(results, key, scale, table=table, task=task, variant=variant, **match))


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def check_mixit_matches(results: Sequence[Result], signal: dict[str, Any] | None) -> Check:
    parts: list[str] = []
    oks: list[bool | None] = []
    for task in ("addition", "modular_addition", "dyck", "memorization"):
        s, m = _acc(results, "table3", task, "standard"), _acc(results, "table3", task, "mixit")
        if s is None or m is None:
            parts.append(f"{task}: missing")
            oks.append(None)
            continue
        parts.append(f"{task}: mixit {m:.1f}% vs standard {s:.1f}%")
        oks.append(m >= s - 5)
    ok = None if None in oks else all(oks)
    return Check(
        "MixiT within 5 points of the standard model on addition, modular addition, Dyck and memorization",
        _verdict(ok),
        "; ".join(parts),
    )


def check_retrieval_gap(results: Sequence[Result], signal: dict[str, Any] | None) -> Check:
    parts: list[str] = []
    oks: list[bool | None] = []
    for task in ("retrieval", "induction"):
        accs = {v: _acc(results, "table1", task, v) for v in ("standard", "frozen_qk", "mixit")}
        if None in accs.values():
            parts.append(f"{task}: missing")
            oks.append(None)
            continue
        m = accs["mixit"]
        assert m is not None
        parts.append(f"{task}: mixit {m:.1f}%, standard {accs['standard']:.1f}%, frozen_qk {accs['frozen_qk']:.1f}%")
        oks.append(all(m <= (a or 0) - 30 for v, a in accs.items() if v != "mixit"))
    ok = None if None in oks else all(oks)
    return Check(
        "MixiT at least 30 points below both the standard model and frozen Q/K on retrieval and induction",
        _verdict(ok),
        "; ".join(parts),
    )


def _induction_score(results: Sequence[Result], variant: str) -> float | None:
    scores = [
        r.heads["induction"]["score"]
        for r, _ in _rows(results, table="table1", task="induction", variant=variant)
        if r.heads is not None
    ]
    return mean(scores)


def check_induction_heads(results: Sequence[Result], signal: dict[str, Any] | None) -> Check:
    f, m = _induction_score(results, "frozen_qk"), _induction_score(results, "mixit")
    if f is None or m is None:
        return Check("frozen Q/K forms an induction head (score > 0.5) and MixiT does not (< 0.1)", "n/a", "missing")
    return Check(
        "frozen Q/K forms an induction head (score > 0.5) and MixiT does not (< 0.1)",
        _verdict(f > 0.5 and m < 0.1),
        f"strongest induction head on the induction task: frozen_qk {f:.3f}, mixit {m:.3f}",
    )


def check_bits(results: Sequence[Result], signal: dict[str, Any] | None) -> Check:
    bits = {
        v: mean(values(results, "bits_per_trainable_param", 1, table="table4", task="memorization", variant=v))
        for v in ("standard", "frozen_qk", "mixit", "frozen_mlp")
    }
    name = "bits per trainable parameter ordered standard > frozen Q/K and MixiT > frozen MLP"
    if any(b is None for b in bits.values()):
        return Check(name, "n/a", "missing")
    b = {k: v for k, v in bits.items() if v is not None}
    ok = b["standard"] > max(b["frozen_qk"], b["mixit"]) and min(b["frozen_qk"], b["mixit"]) > b["frozen_mlp"]
    return Check(name, _verdict(ok), ", ".join(f"{k} {v:.3f}" for k, v in b.items()))


def check_lm(results: Sequence[Result], signal: dict[str, Any] | None) -> Check:
    name = (
        "language-model loss ordered standard < frozen Q/K < MixiT, frozen Q/K's gap to standard smaller than MixiT's"
    )
    parts: list[str] = []
    oks: list[bool | None] = []
    corpora = sorted({str(labels.get("corpus")) for _, labels in _rows(results, table="table2")})
    for corpus in corpora:
        loss = {
            v: mean(values(results, "loss", 1, table="table2", task="lm", variant=v, corpus=corpus))
            for v in ("standard", "frozen_qk", "mixit")
        }
        if any(x is None for x in loss.values()):
            parts.append(f"{corpus}: missing")
            oks.append(None)
            continue
        s, f, m = (loss[v] for v in ("standard", "frozen_qk", "mixit"))
        assert s is not None and f is not None and m is not None
        parts.append(f"{corpus}: standard {s:.3f}, frozen_qk {f:.3f}, mixit {m:.3f} nats")
        oks.append(s < f < m and (f - s) < (m - s))
    ok = None if not oks or None in oks else all(oks)
    return Check(name, _verdict(ok), "; ".join(parts) or "missing")


def _by(results: Sequence[Result], key: str, metric: str, scale: float, **match: Any) -> dict[Any, float]:
    groups: dict[Any, list[float]] = defaultdict(list)
    for r, labels in _rows(results, **match):
        if r.state == "done" and metric in r.test:
            groups[labels[key]].append(scale * r.test[metric])
    return {k: statistics.fmean(v) for k, v in sorted(groups.items())}


def check_heads(results: Sequence[Result], signal: dict[str, Any] | None) -> Check:
    acc = _by(results, "n_heads", "token_acc", 100, table="table5", task="addition")
    name = "MixiT's addition accuracy rising with the number of heads"
    if len(acc) < 2:
        return Check(name, "n/a", "missing")
    heads = sorted(acc)
    return Check(name, _verdict(acc[heads[-1]] > acc[heads[0]]), ", ".join(f"{h} heads {acc[h]:.1f}%" for h in heads))


def check_depth(results: Sequence[Result], signal: dict[str, Any] | None) -> Check:
    name = (
        "the random transformer's addition accuracy falling with depth while MixiT's does not, and its token "
        "similarity rising with depth while MixiT's stays flat"
    )
    random = _by(results, "n_layers", "token_acc", 100, table="table6", variant="random")
    mixit = _by(results, "n_layers", "token_acc", 100, table="table6", variant="mixit")
    if len(random) < 2 or len(mixit) < 2 or signal is None:
        return Check(name, "n/a", "missing")
    lo, hi = min(random), max(random)
    trained_ok = random[hi] < random[lo] and mixit[max(mixit)] >= mixit[min(mixit)] - 5
    cos = {v: {int(d): x["cosine"] for d, x in by_depth.items()} for v, by_depth in signal["results"].items()}
    d_lo, d_hi = min(cos["random"]), max(cos["random"])
    rise = cos["random"][d_hi] - cos["random"][d_lo]
    flat = abs(cos["mixit"][d_hi] - cos["mixit"][d_lo])
    evidence = (
        f"trained accuracy at {lo} -> {hi} layers: random {random[lo]:.1f}% -> {random[hi]:.1f}%, "
        f"mixit {mixit[min(mixit)]:.1f}% -> {mixit[max(mixit)]:.1f}%; token cosine at initialisation, "
        f"{d_lo} -> {d_hi} layers: random {cos['random'][d_lo]:.3f} -> {cos['random'][d_hi]:.3f}, "
        f"mixit {cos['mixit'][d_lo]:.3f} -> {cos['mixit'][d_hi]:.3f}"
    )
    return Check(name, _verdict(trained_ok and rise > 0.1 and flat < 0.1), evidence)


CHECKS: list[Callable[[Sequence[Result], dict[str, Any] | None], Check]] = [
    check_mixit_matches,
    check_retrieval_gap,
    check_induction_heads,
    check_bits,
    check_lm,
    check_heads,
    check_depth,
]
"""The paper's findings, each evaluated on the study's results."""


# -- per-example analyses --------------------------------------------------------------------------


def retrieval_by_pairs(path: Path) -> dict[int, float]:
    """Accuracy (%) of a trained retrieval model on its test set, by the number of stored pairs.

    An example with k pairs asks at position 2k (docs/tasks.md, "retrieval")."""
    loaded = Run.open(path).load("cpu")
    batch = loaded.task.test_batch()
    with torch.no_grad():
        preds = torch.cat(
            [loaded.model.eval()(batch.inputs[i : i + 500]).argmax(-1) for i in range(0, len(batch), 500)]
        )
    position = batch.mask.float().argmax(dim=1)  # (N,) the scored position
    right = (preds.gather(1, position[:, None]) == batch.targets.gather(1, position[:, None]))[:, 0]
    k = (position // 2).numpy()
    return {int(n): 100 * float(right.numpy()[k == n].mean()) for n in np.unique(k)}


# -- figures ---------------------------------------------------------------------------------------


def _figure(width: float = 6.0, height: float = 4.0) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots()


def plot_curves(results: Sequence[Result], table: str, task: str, path: Path, **match: Any) -> bool:
    """Test metric against step, one line per variant (the first seed of each)."""
    rows = [(r, labels) for r, labels in _rows(results, table=table, task=task, **match) if r.curve]
    if not rows:
        return False
    fig, ax = _figure()
    seen = set()
    for r, labels in rows:
        if labels["variant"] in seen:
            continue
        seen.add(labels["variant"])
        steps, ys = zip(*r.curve)
        ax.plot(steps, ys, marker="o", markersize=3, label=labels["variant"])
    column = HEADLINE[task][0]
    ax.set_xlabel("step")
    ax.set_ylabel(column + (" (%)" if column == "accuracy" else " (nats)"))
    ax.set_title(f"{task}: test {column} during training", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=100)
    return True


def plot_lines(
    series: dict[str, dict[Any, float]], xlabel: str, ylabel: str, title: str, path: Path, log2: bool = False
) -> bool:
    series = {k: v for k, v in series.items() if v}
    if not series:
        return False
    fig, ax = _figure()
    for name, points in series.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=name)
    if log2:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=100)
    return True


# -- the report ------------------------------------------------------------------------------------


def results_csv(results: Sequence[Result]) -> str:
    """One row per run: id, state, labels, every config field, every test metric."""

    def flat(prefix: str, d: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out.update(flat(f"{prefix}{k}.", v))
            else:
                out[f"{prefix}{k}"] = v
        return out

    rows = []
    for r in results:
        labels = r.labels[0]
        row = {
            "id": r.id,
            "state": r.state,
            "tables": ";".join(sorted({lb["table"] for lb in r.labels})),
            **{f"label.{k}": v for k, v in labels.items() if k != "table"},
            **flat("", r.config),
            **{f"test.{k}": v for k, v in r.test.items()},
            "train_seconds": r.seconds,
            "error": r.error,
        }
        rows.append(row)
    fields = list(dict.fromkeys(k for row in rows for k in row))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def write_report(study_dir: Path) -> dict[str, Any]:
    """Write report.md, results.csv and figures/ for the study in `study_dir`; return the checks and counts.

    Args:
        study_dir: the study directory (`mixit reproduce --out`).
    """
    study_dir = Path(study_dir)
    record, results = collect(study_dir)
    figures = study_dir / "figures"
    figures.mkdir(exist_ok=True)
    signal_path = study_dir / "signal" / "signal.json"
    signal = read_json(signal_path, "signal.json") if signal_path.exists() else None
    counts = {s: sum(r.state == s for r in results) for s in ("done", "failed", "interrupted", "new")}
    lines = [
        f"# {record['name']}: the paper's comparison",
        "",
        f"Preset `{record.get('preset')}`, {record.get('seeds')} seed(s) per cell (mean ± sample standard "
        f"deviation over seeds where there are several); {len(results)} runs: {counts['done']} done, "
        f"{counts['failed']} failed, {counts['interrupted'] + counts['new']} not finished. "
        f"Made by mixit {__version__} at commit {git_commit()}; each run's config.json names its own. "
        "The paper's numbers are from arXiv 2506.01115 v3, at the paper's scales; ours are at the preset's.",
        "",
    ]
    checks = [make(results, signal) for make in CHECKS]
    lines += ["## The paper's findings, checked", "", "| finding | verdict | numbers |", "|---|---|---|"]
    lines += [f"| {c.name} | **{c.verdict}** | {c.evidence} |" for c in checks]

    def section(title: str, body: list[str]) -> None:
        if any(body):
            lines.extend(["", f"## {title}", "", *body])

    body = []
    for task in ("retrieval", "induction"):
        body += [f"**{task}**", "", variant_table(results, "table1", task, ("standard", "frozen_qk", "mixit")), ""]
        heads = []
        for variant in ("standard", "frozen_qk", "mixit"):
            found = [r.heads for r, _ in _rows(results, table="table1", task=task, variant=variant) if r.heads]
            if found:
                ind = mean([h["induction"]["score"] for h in found])
                prev = mean([h["previous_token"]["score"] for h in found])
                heads.append(f"{variant}: strongest induction head {ind:.3f}, previous-token head {prev:.3f}")
        if heads:
            body += ["Head scores (`mixit analyze`, 1 = all attention on the target): " + "; ".join(heads) + ".", ""]
        if plot_curves(results, "table1", task, figures / f"curves-{task}.png"):
            body.append(f"![{task} curves](figures/curves-{task}.png)")
        for r, labels in _rows(results, table="table1", task=task):
            for name in ("attention.png", "head_scores.png"):
                src = run_dir(study_dir, r.id) / "analysis" / name
                if labels.get("seed") == 0 and src.exists():
                    dst = figures / f"{task}-{labels['variant']}-{name}"
                    shutil.copy(src, dst)
                    body.append(f"![{task} {labels['variant']} {name}](figures/{dst.name})")
        body.append("")
    pairs: dict[str, dict[Any, float]] = {}
    for r, labels in _rows(results, table="table1", task="retrieval"):
        if r.state == "done" and labels.get("seed") == 0:
            pairs[labels["variant"]] = retrieval_by_pairs(run_dir(study_dir, r.id))
    if plot_lines(
        pairs,
        "pairs stored in the example",
        "accuracy (%)",
        "retrieval accuracy by number of pairs (the paper's Fig. 2)",
        figures / "retrieval-by-pairs.png",
    ):
        body.append("![retrieval by pairs](figures/retrieval-by-pairs.png)")
    section("Table 1: retrieval and induction", body)

    body = []
    for corpus in sorted({str(labels.get("corpus")) for _, labels in _rows(results, table="table2")}):
        body += [
            f"**{corpus}**",
            "",
            variant_table(results, "table2", "lm", ("standard", "frozen_qk", "mixit", "frozen_mlp"), corpus=corpus),
            "",
        ]
        if plot_curves(results, "table2", "lm", figures / f"curves-lm-{corpus}.png", corpus=corpus):
            body.append(f"![lm curves](figures/curves-lm-{corpus}.png)")
    section("Table 2: language modelling (held-out loss, nats)", body)

    body = []
    for task in ("addition", "dyck", "modular_addition", "memorization", "sentiment"):
        variants = ("standard", "frozen_qk", "frozen_mlp", "mixit")
        table = variant_table(results, "table3", task, variants)
        if table:
            body += [f"**{task}**", "", table, ""]
            if plot_curves(results, "table3", task, figures / f"curves-{task}.png"):
                body.append(f"![{task} curves](figures/curves-{task}.png)")
                body.append("")
    section("Table 3: arithmetic, Dyck, memorization, sentiment", body)
    section(
        "Table 4: memorization capacity",
        [variant_table(results, "table4", "memorization", ("standard", "frozen_qk", "mixit", "frozen_mlp"))],
    )

    body = []
    by_heads = {
        task: _by(results, "n_heads", HEADLINE[task][1], 100, table="table5", task=task)
        for task in ("addition", "sentiment")
    }
    for task, acc in by_heads.items():
        if acc:
            body.append(f"- MixiT on {task}: " + ", ".join(f"{h} heads {a:.1f}%" for h, a in acc.items()))
    if plot_lines(
        {f"mixit, {t}": a for t, a in by_heads.items()},
        "heads",
        "accuracy (%)",
        "MixiT accuracy by number of heads",
        figures / "heads.png",
        log2=True,
    ):
        body += ["", "![heads](figures/heads.png)"]
    section("Table 5: MixiT and the number of heads (paper: addition 35% -> 92% at 256 heads)", body)

    body = []
    depth = {v: _by(results, "n_layers", "token_acc", 100, table="table6", variant=v) for v in ("random", "mixit")}
    for variant, acc in depth.items():
        if acc:
            body.append(
                f"- {variant}, trained on addition: " + ", ".join(f"{d} layers {a:.1f}%" for d, a in acc.items())
            )
    if plot_lines(depth, "layers", "accuracy (%)", "addition accuracy by depth, trained", figures / "depth.png"):
        body += ["", "![depth](figures/depth.png)"]
    if signal is not None:
        depths = signal["config"]["depths"]
        body += [
            "",
            "Token similarity after the last block at initialisation (`mixit signal`; cosine / covariance):",
            "",
            "| variant | " + " | ".join(f"{d} layers" for d in depths) + " |",
            "|---" * (1 + len(depths)) + "|",
        ]
        for variant, by_depth in signal["results"].items():
            body.append(
                f"| {variant} | "
                + " | ".join(f"{by_depth[str(d)]['cosine']:.3f} / {by_depth[str(d)]['covariance']:.3f}" for d in depths)
                + " |"
            )
        shutil.copy(study_dir / "signal" / "signal.png", figures / "signal.png")
        body += ["", "![signal](figures/signal.png)"]
    section(
        "Tables 6-7: depth (paper: random 100% -> about 23% at 8-16 layers, MixiT 100%; covariance "
        "0.0022 -> 0.054 for random, flat for MixiT)",
        body,
    )

    body = []
    by_pairs = {v: _by(results, "max_pairs", "token_acc", 100, table="pairs", variant=v) for v in ("standard", "mixit")}
    for variant, acc in by_pairs.items():
        if acc:
            body.append(f"- {variant}: " + ", ".join(f"up to {p} pairs {a:.1f}%" for p, a in acc.items()))
    if plot_lines(
        by_pairs,
        "max pairs (sequence length 2 max_pairs + 3)",
        "accuracy (%)",
        "retrieval accuracy against sequence length",
        figures / "pairs.png",
    ):
        body += ["", "![pairs](figures/pairs.png)"]
    failed = [r for r in results if r.state == "failed"]
    if failed:
        body += ["", "Failed runs:", ""] + [
            f"- `{r.id}` ({', '.join(f'{k}={v}' for k, v in r.labels[0].items())}): {r.error}" for r in failed
        ]
    section("Beyond the paper: sequence length, frozen MLP on text, failures", body)
    lines.append("")
    write_text(study_dir / "report.md", "\n".join(lines))
    write_text(study_dir / "results.csv", results_csv(results))
    verdicts = {c.name: {"verdict": c.verdict, "evidence": c.evidence} for c in checks}
    write_text(study_dir / "checks.json", json.dumps(verdicts, indent=2) + "\n")
    return {"checks": verdicts, "counts": counts, "report": str(study_dir / "report.md")}


def format_checks(result: dict[str, Any]) -> str:
    lines = [f"{c['verdict']:>4}  {name}\n      {c['evidence']}" for name, c in result["checks"].items()]
    counts = result["counts"]
    lines.append(
        f"runs: {counts['done']} done, {counts['failed']} failed, "
        f"{counts['interrupted'] + counts['new']} not finished; report: {result['report']}"
    )
    return "\n".join(lines)
