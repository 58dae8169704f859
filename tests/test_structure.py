"""The package's structure: modules import only downwards, the CLI only parses
and dispatches, library code leaves global state alone, and nothing points
outside the repository."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "mixit"

# Each module's layer (docs/design.md, "Layout"): a module may import modules of
# its own layer or lower ones, never higher ones and never the package itself.
LAYERS = {
    0: ["errors", "registry", "plugins", "version", "files", "runtime", "distributed"],
    1: ["config"],
    2: ["models", "text", "precision", "resources"],
    3: ["freezing", "tasks", "recipes"],
    4: ["experiment"],
    5: ["checkpoint", "run", "transplant"],
    6: ["training"],
    7: ["tracking", "catalogue", "analysis", "generate", "bench", "export", "remote_code", "interop"],
    8: ["study", "litmus"],
    9: ["cli", "flags"],
    10: ["__init__", "__main__"],
}
LAYER_OF = {name: layer for layer, names in LAYERS.items() for name in names}
CORE = {"config", "models", "text", "precision", "resources", "freezing", "tasks", "recipes", "experiment"}
CORE |= {"checkpoint", "run", "transplant", "training"}
"""What src/mixit/core/ holds (docs/design.md, "Layout"): layers 1 to 6, above the base (layer 0), below the tooling."""
# The one upward import kept, inside functions (docs/design.md, "Layout"): resolving a transplant's config reads its
# donor, which is a run, and building its model installs the donor's attention.
UPWARD = {("experiment", "mixit.core.transplant")}


def module_name(parts):
    """The layered name of a module from its path's parts below src/mixit (or its dotted name's below mixit):
    a module of the core is named by its part below core/."""
    top = parts[1] if parts[0] == "core" and len(parts) > 1 else parts[0]
    return top.removesuffix(".py")


def modules():
    for path in sorted(SRC.rglob("*.py")):
        if path.relative_to(SRC).parts != ("core", "__init__.py"):
            yield path, module_name(path.relative_to(SRC).parts)


def mixit_imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mixit":
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "mixit")


def test_the_design_notes_show_these_layers():
    """docs/design.md's module table is this test's LAYERS, row by row."""
    text = (ROOT / "docs" / "design.md").read_text()
    table = text[text.index("| layer | modules |") :].split("\n\n")[0]
    documented = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        documented[int(cells[0])] = re.findall(r"`(\w+)`", cells[1])
    assert documented == LAYERS


def test_every_module_has_a_layer():
    assert {top for _, top in modules()} <= set(LAYER_OF)


def test_the_core_is_one_package_between_the_base_and_the_tooling():
    """src/mixit/core/ holds exactly the layers 1 to 6, so the core imports nothing of the tooling around it."""
    in_core = {name for path, name in modules() if path.relative_to(SRC).parts[0] == "core"}
    assert in_core == CORE == {name for layer in range(1, 7) for name in LAYERS[layer]}


def test_no_module_imports_a_module_above_it_or_the_package():
    upward = []
    for path, top in modules():
        for name in mixit_imports(path):
            parts = name.split(".")
            if len(parts) == 1:
                if top not in ("__init__", "__main__"):
                    upward.append(f"{path.relative_to(SRC)} imports the package `mixit` itself")
                continue
            target = module_name(parts[1:])
            if LAYER_OF[target] > LAYER_OF[top] and (top, name) not in UPWARD:
                upward.append(
                    f"{path.relative_to(SRC)} (layer {LAYER_OF[top]}) imports {name} (layer {LAYER_OF[target]})"
                )
    assert not upward, "\n".join(upward)


def test_cli_only_parses_and_dispatches():
    """cli.py does no tensor, model or file work itself: no torch, numpy or
    safetensors, no open/read/write/mkdir."""
    tree = ast.parse((SRC / "cli.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"torch", "numpy", "safetensors", "shutil", "os"}
    calls = {
        n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, (ast.Attribute, ast.Name))
        and not (isinstance(n.func, ast.Attribute) and getattr(n.func.value, "id", "") == "Run")
    }
    assert not calls & {"open", "read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink", "rmtree"}


def test_library_import_and_plotting_leave_global_state_alone(tmp_path):
    """Importing mixit and drawing every figure keeps the matplotlib backend,
    torch's threads and the global random state as they were."""
    script = f"""
import matplotlib
matplotlib.use("svg")
import torch
torch.manual_seed(123)
threads = torch.get_num_threads()
state = torch.random.get_rng_state()
import numpy as np
import mixit
from mixit.analysis.attention_maps import plot_pattern_grid, plot_score_tables
from mixit.analysis.signal import SignalOptions, plot_signal, signal_propagation
from mixit.bench import bench_hf, Shape
from mixit.core.precision import Precision
plot_pattern_grid(np.random.default_rng(0).random((1, 2, 4, 4)), r"{tmp_path}/a.png", "t")
scores = {{k: [[0.1, 0.2]] for k in ("previous_token", "induction", "duplicate_token")}}
plot_score_tables(scores, r"{tmp_path}/b.png", "t")
options = SignalOptions(variants=["standard"], depths=[1, 2], d_model=16, n_heads=2, n_ctx=8, seeds=1)
plot_signal(signal_propagation(options), r"{tmp_path}/c.png")
shape = Shape(d_model=16, n_layers=1, n_heads=2, vocab_size=8, seq_len=8, batch_size=2)
bench_hf(shape, Precision("fp32", torch.device("cpu")))
assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
assert torch.get_num_threads() == threads
assert torch.equal(torch.random.get_rng_state(), state)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    assert all((tmp_path / f).stat().st_size > 1000 for f in ("a.png", "b.png", "c.png"))


@pytest.mark.parametrize("folder", ["src", "docs", "tests", "scripts", "examples"])
def test_nothing_points_outside_the_repository(folder):
    outside = "../" + "shared"  # spelled in two parts, so this file does not match itself
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / folder).rglob("*")
        if p.is_file()
        and p.suffix in (".py", ".md", ".sh", ".toml", ".txt")
        and "egg-info" not in str(p)
        and outside in p.read_text(errors="ignore")
    ]
    assert not offenders, offenders
    assert outside not in (ROOT / "README.md").read_text()


def test_the_glossary_names_what_exists():
    """Each dotted `mixit.` name in docs/design.md's glossary imports: a rename that forgets the glossary fails."""
    import importlib

    text = (ROOT / "docs" / "design.md").read_text()
    glossary = text[text.index("## Glossary") : text.index("## The model")]
    names = re.findall(r"`(mixit(?:\.\w+)+)`", glossary)
    assert len(names) >= 10
    for name in names:
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
                break
            except ModuleNotFoundError:
                continue
        for attr in parts[cut:]:
            assert hasattr(obj, attr), f"docs/design.md's glossary names {name}, which does not exist"
            obj = getattr(obj, attr)
