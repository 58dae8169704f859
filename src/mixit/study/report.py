"""The report of a study (`mixit report STUDY_DIR`): report.md, results.csv, checks.json and figures/.

The paper's study (a preset) reports every finding as a check judged over seeds, then a section per table of
`mixit.study.tables.TABLES`; a study of your own, a row per cell, each task's curves and its metric against each
numeric label of its grid. Both end with every candidate a search screened and the failed runs. The report trains
and evaluates nothing: it reads what the runs, their analyses and the signal sweeps wrote.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mixit.files import check_output_dir, write_text
from mixit.study.atlas import atlas_section
from mixit.study.cells import cell_name, converged, converged_cell, fmt, not_converged, spread
from mixit.study.collect import Result, StudyResults, collect, reported, task_class
from mixit.study.directory import check_report_paths
from mixit.study.figures import plot_cell_curves, plot_lines
from mixit.study.presets import PRESETS
from mixit.study.render import results_csv, settings
from mixit.study.spec import BUDGET
from mixit.study.tables import TABLES
from mixit.study.verdicts import Check
from mixit.version import __version__, git_commit, protocol_commit

if TYPE_CHECKING:
    from matplotlib.figure import Figure

STATES = ("done", "failed", "damaged", "interrupted", "new")

SEARCH_LABELS = ("table", "task", "variant", "cell", "group", "seed", "cell_seed", "rung", "tie", "extends")
"""The labels of a screening run that are not its candidate settings."""


def checks_table(checks: list[Check]) -> list[str]:
    """The findings at a glance: verdict, seeds in which every part held, evidence."""
    lines = ["| finding | verdict | holds in | evidence |", "|---|---|---|---|"]
    for c in checks:
        holds = f"{c.holds}/{c.seeds} seeds" if c.parts else "-"
        lines.append(f"| {c.name} | **{c.verdict}** | {holds} | {c.evidence} |")
    return lines


def judgement_section(checks: list[Check]) -> list[str]:
    """How each finding was judged: per part and seed its margin and test-set error, the interval over seeds,
    each cell's number, budget and convergence, and what keeps it undecided."""
    lines: list[str] = []
    for c in checks:
        judged = [*c.parts, *([c.precondition] if c.precondition else [])]
        if not judged:
            continue
        lines += [f"**{c.name}**: {c.verdict}", ""]
        lines += ["| part | seed | margin ± test SE |", "|---|---|---|"]
        for p in judged:
            d = p.digits
            lines += [f"| {p.name} | {s.seed} | {s.margin:+.{d}f} ± {s.se:.{d}f}{p.unit} |" for s in p.seeds]
        lines.append("")
        for p in judged:
            bound = ""
            if p.interval is not None:
                bound = (
                    f"; mean {p.mean:+.{p.digits}f}, one-sided bounds over {len(p.seeds)} seeds "
                    f"{p.interval[0]:+.{p.digits}f} / {p.interval[1]:+.{p.digits}f} (t quantile {p.quantile:.2f})"
                )
            lines.append(f"- {p.name}: **{p.verdict}**{bound}")
        lines += ["", "| cell | seed | number ± SE | steps trained / cap | converged |", "|---|---|---|---|---|"]
        shown = set()  # a cell two parts read is shown once per seed
        for p in judged:
            for s in p.seeds:
                for cell in s.cells:
                    if (cell.cell, s.seed) in shown:
                        continue
                    shown.add((cell.cell, s.seed))
                    cap = f"{cell.cap:,}" + (f" ({cell.budget}x the preset's)" if cell.budget > 1 else "")
                    lines.append(
                        f"| {cell.cell} | {s.seed} | {cell.value:.4g} ± {cell.se:.2g} | {cell.steps:,} / {cap} | "
                        f"{'yes' if cell.converged else 'no'} |"
                    )
        if c.blocking:
            lines += ["", "Not decided because:", "", *[f"- {b}" for b in c.blocking]]
        lines.append("")
    return lines


def search_appendix(study: StudyResults) -> list[str]:
    """Every screening run, by task and variant: the cell and seed it searched for, its candidate, the best value
    of its validation curve, and whether it was chosen."""
    screens = study.screens
    if not screens:
        return []
    # (cell, task, variant, seed) -> the settings chosen for that cell's seed, by last path segment; under seed
    # None, those of every seed (an older study labels its screening runs with no cell seed)
    chosen: dict[tuple[str, str, str, Any], list[dict[str, Any]]] = defaultdict(list)
    for r in [r for r in study.final if r.chosen]:
        short = {path.split(".")[-1]: value for path, value in r.chosen.items()}
        for labels in r.labels:
            searched = (labels.get("table", ""), labels.get("task", ""), labels.get("variant", ""))
            chosen[(*searched, r.config.get("model", {}).get("seed", labels.get("seed")))].append(short)
            chosen[(*searched, None)].append(short)
    groups: dict[tuple[str, str], list[tuple[Result, dict[str, Any]]]] = defaultdict(list)
    for r in screens:
        for labels in r.labels:  # a screening run two cells share is listed for each
            groups[(labels.get("task", ""), labels.get("variant", ""))].append((r, labels))
    lines = []
    for (task, variant), found in sorted(groups.items()):
        lines += [
            f"**{task} / {variant}**",
            "",
            "| for | seed | candidate | best validation metric | converged | chosen |",
            "|---|---|---|---|---|---|",
        ]
        for r, labels in sorted(
            found, key=lambda x: (str(x[1].get("cell")), x[1].get("cell_seed", -1), str(x[1].get("group")))
        ):
            candidate = {k: v for k, v in labels.items() if k not in SEARCH_LABELS}
            done = "-" if r.state != "done" else "yes" if converged(r) else not_converged(r, "no")
            cell = (labels.get("cell", ""), task, variant, labels.get("cell_seed"))
            picked = candidate in chosen.get(cell, [])
            where = f" (rung {labels['rung']})" if labels.get("rung") else ""
            where += " (tie-break)" if labels.get("tie") else ""
            where += f" (beyond the grid's {labels['extends'].split('.')[-1]})" if labels.get("extends") else ""
            lines.append(
                f"| {labels.get('cell', '-')} | {labels.get('cell_seed', '-')} | {settings(candidate) or '-'}{where} | "
                f"{selection(r)} | {done} | {'**chosen**' if picked else ''} |"
            )
        lines.append("")
    return lines


def selection(r: Result) -> str:
    """The validation metric a screening run was judged by, at its best (else at its end)."""
    if r.state != "done":
        return r.state
    name = (r.convergence or {}).get("metric") or task_class(r.config["task"]).report_metric[1]
    value = (r.convergence or {}).get("best", r.val.get(name))
    if value is None:
        return "-"
    return f"{name} {100 * value:.1f}%" if "acc" in name else f"{name} {value:.3f}"


def header(study: StudyResults, counts: dict[str, int]) -> list[str]:
    """The report's title and first paragraph: the preset, the runs and their states, and how to read it."""
    record, screened = study.record, len(study.screens)
    damaged = f"{counts['damaged']} damaged, " if counts["damaged"] else ""
    first, n = record.get("first_seed") or 0, record.get("seeds") or 1
    span = f" (seeds {first}-{first + n - 1})" if first else ""
    runs = (
        f"{record.get('seeds')} seed(s) per cell{span} (mean ± sample standard deviation over seeds where there "
        f"are several); {len(study.results)} runs"
        + (f" ({screened} of them screening runs of the search)" if screened else "")
        + f": {counts['done']} done, {counts['failed']} failed, {damaged}{counts['interrupted'] + counts['new']} not "
        f"finished. Made by mixit {__version__} at commit {git_commit()}; each run's config.json names its own."
    )
    if record.get("preset") not in PRESETS:  # a study file's preset is "file"
        description = [str(record["description"]), ""] if record.get("description") else []
        return [f"# {record['name']}", "", *description, runs, ""]
    return [
        f"# {record['name']}: the paper's comparison",
        "",
        f"Preset `{record.get('preset')}`, {runs} "
        "The paper's numbers are from arXiv 2506.01115 v3, at the paper's scales; ours are at the preset's. "
        "A finding is judged by a one-sided t interval of its margin over independent seeds, each seed its own "
        "search, training and test set (docs/protocol.md, pre-registered; the rule and its constants at "
        f"protocol commit {protocol_commit() or 'unknown'}): PASS or FAIL where the interval clears 0, UNDECIDED "
        "where it does not, PROVISIONAL with fewer seeds than a verdict needs, UNTESTABLE where what the finding "
        "presupposes did not happen, n/a where an input run is missing, failed or damaged.",
        "",
    ]


def own_cells(study: StudyResults) -> dict[tuple[tuple[str, Any], ...], list[Result]]:
    """A study of your own's final runs by their labels but the seed and budget (a list label joined by ", ")."""
    cells: dict[tuple[tuple[str, Any], ...], list[Result]] = defaultdict(list)
    for r in study.final:
        labels = {k: ", ".join(map(str, v)) if isinstance(v, list) else v for k, v in r.labels[0].items()}
        cells[tuple((k, v) for k, v in labels.items() if k not in ("seed", BUDGET))].append(r)
    return cells


def cells_section(study: StudyResults) -> list[str]:
    """A study of your own, cell by cell: labels, seeds done, each test metric over them, and convergence."""
    cells = own_cells(study)
    if not cells:
        return []
    names = list(dict.fromkeys(k for key in cells for k, _ in key))
    metrics = list(
        dict.fromkeys(m for found in cells.values() for r in found if r.state == "done" for m in reported(r))
    )
    lines = [
        "Test metrics at each run's best validation evaluation (summary.json's `selected`; for a run of older "
        "code that recorded none, its last evaluation), as in results.csv's `selected.test.*`.",
        "",
        "| " + " | ".join([*names, "seeds done", *(f"test {m}" for m in metrics), "converged"]) + " |",
        "|" + "---|" * (len(names) + len(metrics) + 2),
    ]
    for key, found in cells.items():
        labels, done = dict(key), [r for r in found if r.state == "done"]
        values = [fmt([reported(r)[m] for r in done if m in reported(r)], 4) for m in metrics]
        row = [*(str(labels.get(n, "-")) for n in names), f"{len(done)}/{len(found)}", *values]
        lines.append("| " + " | ".join([*row, converged_cell([(r, r.labels[0]) for r in found])]) + " |")
    return lines


def _done_by_task(study: StudyResults) -> dict[str, dict[tuple[tuple[str, Any], ...], list[Result]]]:
    """`own_cells` by task, each with its finished runs."""
    by_task: dict[str, dict[tuple[tuple[str, Any], ...], list[Result]]] = defaultdict(dict)
    for key, found in own_cells(study).items():
        by_task[found[0].config["task"]][key] = [r for r in found if r.state == "done"]
    return by_task


def curves_section(study: StudyResults) -> list[str]:
    """A study of your own: each task's learning curves, one line per cell."""
    body = []
    for task, cells in _done_by_task(study).items():
        named = {cell_name(dict(key)): done for key, done in cells.items()}
        if plot_cell_curves(named, task, study.figures / f"curves-{task}.png"):
            body += [f"![{task} curves](figures/curves-{task}.png)", ""]
    return body


def axis_figures(study: StudyResults) -> dict[str, Figure]:
    """A study of your own: per task and numeric label of its grid (`lr`), the task's report metric against it,
    one line per value of the other labels (mean and std bars over seeds; a log axis where the values span 10x),
    by file name under figures/ ("lr-addition.png")."""
    figures = {}
    for task, cells in _done_by_task(study).items():
        metric = task_class(task).report_metric[1]
        labels = [dict(key) for key in cells]
        for axis in dict.fromkeys(k for found in labels for k in found):
            given = {found.get(axis) for found in labels}
            xs = {x for x in given if isinstance(x, int | float) and not isinstance(x, bool)}
            if len(xs) < 2 or len(xs) < len(given):  # fewer than two numbers, or a cell without a number here
                continue
            series: dict[str, dict[Any, float]] = defaultdict(dict)
            errors: dict[str, dict[Any, float | None]] = defaultdict(dict)
            for key, done in cells.items():
                got = [reported(r)[metric] for r in done if metric in reported(r)]
                if got:
                    cell = dict(key)
                    name = cell_name(cell, axis)
                    series[name][cell[axis]], errors[name][cell[axis]] = spread(got)
            title = f"{task}: test {metric} at the best validation evaluation\nmean over seeds; bars: sample std"
            fig = plot_lines(series, axis, f"test {metric}", title, errors=errors)
            if fig is None:
                continue
            if min(xs) > 0 and max(xs) >= 10 * min(xs):
                fig.axes[0].set_xscale("log")
            figures[f"{axis}-{task}.png"] = fig
    return figures


def axis_section(study: StudyResults) -> list[str]:
    """`axis_figures`, written to figures/ and linked."""
    body = []
    for name, fig in axis_figures(study).items():
        fig.savefig(study.figures / name, dpi=100)
        body += [f"![{name.removesuffix('.png')}](figures/{name})", ""]
    return body


def write_report(study_dir: Path) -> dict[str, Any]:
    """Write report.md, results.csv, checks.json and figures/ for the study in `study_dir`; return the checks and
    counts."""
    study_dir = Path(study_dir)
    study = collect(study_dir)
    check_report_paths(study_dir)
    check_output_dir(study_dir)
    study.figures.mkdir(exist_ok=True)
    results = study.results
    counts = {s: sum(r.state == s for r in results) for s in STATES}
    lines = header(study, counts)
    paper = study.record.get("preset") in PRESETS
    checks = [check(study) for table in TABLES for check in table.checks] if paper else []
    if paper:
        lines += ["## The paper's findings, checked", "", *checks_table(checks)]
        lines += ["", "## How each finding was judged", "", *judgement_section(checks)]

    def section(title: str, body: list[str]) -> None:
        while body and not body[-1]:
            body = body[:-1]
        if body:
            lines.extend(["", f"## {title}", "", *body])

    for table in TABLES if paper else ():
        section(table.title, table.section(study))
    if study.record.get("preset") == "atlas":
        section("The atlas: which parts each task needs", atlas_section(study))
    if not paper:
        section("Cells", cells_section(study))
        section("Curves", curves_section(study))
        section("Against the grid", axis_section(study))
    section("Search: every candidate screened", search_appendix(study))
    failed = [r for r in results if r.state == "failed"]
    section(
        "Failed runs",
        [f"- `{r.id}` ({', '.join(f'{k}={v}' for k, v in r.labels[0].items())}): {r.error}" for r in failed],
    )
    damaged = [f"- `{r.id}`: {r.error}" for r in results if r.state == "damaged"]
    note = (
        "These runs finished, but a file of theirs cannot be read, so the checks that need them read n/a. "
        "Remove such a run's directory (runs/<id>) and run the study again to train it anew."
    )
    section("Damaged runs", [note, "", *damaged] if damaged else [])
    lines.append("")
    write_text(study_dir / "report.md", "\n".join(lines))
    write_text(study_dir / "results.csv", results_csv(results))
    verdicts = {c.name: c.to_dict() for c in checks}
    write_text(study_dir / "checks.json", json.dumps(verdicts, indent=2) + "\n")
    return {"checks": verdicts, "counts": counts, "report": str(study_dir / "report.md")}


def format_checks(result: dict[str, Any]) -> str:
    """`write_report`'s result as the lines `mixit reproduce` and `mixit report` print."""
    lines = [f"{c['verdict']:>9}  {name}\n           {c['evidence']}" for name, c in result["checks"].items()]
    counts = result["counts"]
    lines.append(
        f"runs: {counts['done']} done, {counts['failed']} failed, "
        + (f"{counts['damaged']} damaged (see the report), " if counts.get("damaged") else "")
        + f"{counts['interrupted'] + counts['new']} not finished; report: {result['report']}"
    )
    return "\n".join(lines)
