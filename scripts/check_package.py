"""Check the built distributions as a user gets them (`make package`, which CI runs after `make test`).

    python scripts/check_package.py dist --python python3.11 --torch torch==2.13.0

DIST holds what `python -m build` made: one sdist and one wheel, the wheel built from the unpacked sdist,
so a file the sdist lacks is missing from the wheel too. Both must hold every module of src/mixit and every
embedded data file (pyproject.toml's package-data), and the wheel's metadata must name mixit-transformers at
this checkout's version. The wheel is then installed into a fresh virtual environment, beside the torch
build given (an unpinned torch would pull a multi-GB CUDA build onto a CPU-only machine), and from a
directory outside the checkout, so that the source tree is not what is imported, `mixit --version` must
print this version and a tiny training run must finish. Prints each step; exits 1 naming the first
failure.
"""

from __future__ import annotations

import argparse
import email.parser
import fnmatch
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

from mixit.version import DISTRIBUTION, __version__

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "mixit"


class PackageError(Exception):
    """A distribution that is not what a user should get."""


def say(message: str) -> None:
    print(f"check_package: {message}", flush=True)


def expected_files() -> set[str]:
    """Paths under src/mixit that every distribution must hold: the modules and the package data."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["mixit"]
    files = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*") if p.is_file()}
    return {f for f in files if f.endswith(".py") or any(fnmatch.fnmatch(f, pattern) for pattern in patterns)}


def under(names: list[str], prefix: str) -> set[str]:
    """The names below `prefix`, relative to it."""
    return {name[len(prefix) :] for name in names if name.startswith(prefix) and not name.endswith("/")}


def check_contents(kind: str, held: set[str]) -> None:
    missing = expected_files() - held
    if missing:
        raise PackageError(f"the {kind} lacks {len(missing)} file(s) of src/mixit: {', '.join(sorted(missing)[:5])}")
    say(f"the {kind} holds all {len(expected_files())} modules and data files of src/mixit")


def find_one(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    if len(found) != 1:
        raise PackageError(f"{dist} should hold one {pattern}, holds {[p.name for p in found]}")
    return found[0]


def check_distributions(dist: Path) -> Path:
    """Check the sdist's and the wheel's contents and the wheel's metadata; returns the wheel."""
    stem = f"{DISTRIBUTION.replace('-', '_')}-{__version__}"
    sdist, wheel = find_one(dist, f"{stem}.tar.gz"), find_one(dist, f"{stem}-*.whl")
    with tarfile.open(sdist) as tar:
        check_contents("sdist", under(tar.getnames(), f"{stem}/src/mixit/"))
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        check_contents("wheel", under(names, "mixit/"))
        metadata = email.parser.Parser().parsestr(whl.read(f"{stem}.dist-info/METADATA").decode())
    wanted = {"Name": DISTRIBUTION, "Version": __version__, "License-Expression": "MIT"}
    got = {key: metadata[key] for key in wanted}
    if got != wanted:
        raise PackageError(f"the wheel's metadata says {got}, not {wanted}")
    if f"{stem}.dist-info/licenses/LICENSE" not in names:
        raise PackageError("the wheel does not carry LICENSE")
    say(f"{wheel.name}: {got}, with LICENSE")
    return wheel


def run(command: list[str | Path], cwd: Path) -> str:
    """Run `command` in `cwd` with no PYTHONPATH; its stdout, or PackageError with its output's tail."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(c) for c in command], cwd=cwd, env=env | {"HF_HUB_OFFLINE": "1"}, capture_output=True, text=True
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise PackageError(f"`{' '.join(map(str, command))}` exited {done.returncode}: " + " | ".join(tail))
    return done.stdout


def install(python: str, torch: str, wheel: Path, venv: Path) -> Path:
    """A fresh virtual environment in `venv` holding `torch` and the wheel; returns its bin directory."""
    run([python, "-m", "venv", venv], venv.parent)
    bin_dir = venv / "bin"
    run([bin_dir / "pip", "install", "-q", torch], venv.parent)
    run([bin_dir / "pip", "install", "-q", wheel.resolve()], venv.parent)
    say(f"installed {wheel.name} and {torch} into a fresh environment ({python})")
    return bin_dir


def check_installed(bin_dir: Path, here: Path) -> None:
    """From `here`, outside the checkout: the command's version, where mixit is imported from, the data
    files, and a tiny training run read back through the installed package."""
    printed = run([bin_dir / "mixit", "--version"], here).split()
    if __version__ not in printed:
        raise PackageError(f"`mixit --version` printed {' '.join(printed)!r}, not version {__version__}")
    script = (
        "import importlib.metadata, importlib.resources, sys\nimport mixit\n"
        "missing = [f for f in sys.argv[1:] if not importlib.resources.files('mixit').joinpath(f).is_file()]\n"
        f"print(importlib.metadata.version({DISTRIBUTION!r}), mixit.__file__, len(missing))\n"
    )
    version, imported, missing = run([bin_dir / "python", "-c", script, *sorted(expected_files())], here).split()
    if version != __version__ or not Path(imported).is_relative_to(bin_dir.parent) or missing != "0":
        raise PackageError(f"installed {DISTRIBUTION} {version}, mixit imported from {imported}, {missing} missing")
    say(f"`mixit --version`: {' '.join(printed)}; mixit imported from {imported}; every data file installed")
    tiny = ["--task", "addition", "-p", "n_digits=2", "--d-model", "16", "--n-heads", "2", "--n-layers", "1"]
    tiny += ["--steps", "5", "--batch-size", "8", "--test-size", "16", "--val-size", "16", "--no-progress"]
    run([bin_dir / "mixit", "train", *tiny, "--out", here / "run"], here)
    read_back = "import sys\nfrom mixit import Run\nprint(sorted(Run.open(sys.argv[1]).summary()['test']))"
    metrics = run([bin_dir / "python", "-c", read_back, here / "run"], here).strip()
    say(f"a tiny training run from the installed command, read back through it: test metrics {metrics}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dist", type=Path, help="the directory python -m build wrote")
    parser.add_argument("--python", default="python3.11", help="the interpreter of the fresh environment")
    parser.add_argument("--torch", default="torch==2.13.0", help="the torch requirement installed first")
    args = parser.parse_args()
    start = time.monotonic()
    try:
        wheel = check_distributions(args.dist)
        with tempfile.TemporaryDirectory(prefix="mixit-package-") as tmp:
            here = Path(tmp)
            check_installed(install(args.python, args.torch, wheel, here / "venv"), here)
    except PackageError as e:
        print(f"check_package: FAILED: {e}", file=sys.stderr)
        return 1
    say(f"passed in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
