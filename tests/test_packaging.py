"""Packaging: the distribution's name and the install commands that name it, the extras, and the changelog's
newest version (docs/versioning.md, "The distribution"). `make package` builds and installs the real thing."""

import re
import tomllib
from pathlib import Path

from mixit.version import DISTRIBUTION, __version__, install_hint

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]
SINKS = {"tensorboard", "wandb", "mlflow", "trackio"}


def test_the_distribution_is_the_name_the_code_gives():
    assert PROJECT["name"] == DISTRIBUTION == "mixit-transformers"
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "mixit.version.__version__"}
    assert PROJECT["scripts"] == {"mixit": "mixit.cli:main"}  # the command keeps its name


def test_install_hint_names_the_distribution_and_the_extra():
    assert install_hint() == "pip install mixit-transformers"
    assert install_hint("hf") == "pip install 'mixit-transformers[hf]'"


def test_every_extra_the_code_asks_for_exists():
    asked = set()
    for path in (ROOT / "src").rglob("*.py"):
        asked |= set(re.findall(r"install_hint\(\s*['\"]([\w-]+)['\"]", path.read_text()))
    assert {"hf", "bench", "slurm"} <= asked  # the scan sees the calls
    assert asked <= EXTRAS.keys(), f"install_hint names extras pyproject.toml lacks: {asked - EXTRAS.keys()}"


def included(extra: str) -> set[str]:
    """The extras `extra` installs: itself and, recursively, those it names as mixit-transformers[...]."""
    out = {extra}
    for requirement in EXTRAS[extra]:
        own = re.fullmatch(rf"{DISTRIBUTION}\[([\w,-]+)\]", requirement)
        for name in own.group(1).split(",") if own else ():
            out |= included(name)
    return out


def test_each_sink_is_an_extra_track_is_all_of_them_and_dev_everything():
    for sink in SINKS:  # the sink's own library, and accelerate, whose trackers mixit's sinks run on
        assert sorted(re.match(r"[\w-]+", r).group() for r in EXTRAS[sink]) == sorted([sink, "accelerate"])
    assert included("track") == SINKS | {"track"}
    assert included("dev") == set(EXTRAS)


PIP_INSTALL = re.compile(r"\bpip3?\s+install\b")
TAKES_A_PATH = {"-e", "--editable", "-r", "--requirement", "-c", "--constraint", "-t", "--target", "-f", "--find-links"}


def installed_names(text: str) -> list[str]:
    """The distribution names that the `pip install` commands written in `text` install. A command ends at
    a backtick or a parenthesis (its code span or its aside), a shell comment or operator; options, the paths
    they take, a local directory (`-e '.[bench]'`) and a built file (`dist/NAME.whl`) name no distribution."""
    names = []
    for match in PIP_INSTALL.finditer(text):
        tokens = iter(re.split(r"[`()#;&|]", text[match.end() : match.end() + 200])[0].split())
        for token in tokens:
            token = token.strip("'\"")
            if token.startswith("-"):
                if token in TAKES_A_PATH:
                    next(tokens, None)
            elif token and not token.startswith((".", "/", "~")) and "/" not in token:
                names.append(re.sub(r"[-_.]+", "-", re.match(r"[\w.-]*", token).group()).lower())
    return names


def test_installed_names_reads_commands_in_code_and_prose():
    assert installed_names("run `pip install 'mixit[hf]'` then `pip install -e '.[bench]'`") == ["mixit"]
    assert installed_names("(`pip install\n  'mixit-transformers[hf]'`) from the hub") == ["mixit-transformers"]
    assert installed_names("\"needs pyarrow: pip install 'mixit[hf]'\") from None") == ["mixit"]
    assert installed_names("the package (pip install transformers)") == ["transformers"]
    assert installed_names("so `pip install` is enough") == []
    assert installed_names("pip install mixit-transformers   # the package && more") == ["mixit-transformers"]
    assert installed_names("`pip install dist/mixit_transformers-*.whl` installs it") == []


def documented_files() -> list[Path]:
    """The README, the changelog, docs/ (not the records under docs/results/, which are history), src/ (not
    version.py, which spells the command once for install_hint) and examples/."""
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    for folder in ("docs", "src", "examples"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".md", ".py") and p.is_file()]
    skipped = (ROOT / "docs" / "results", ROOT / "src" / "mixit" / "version.py")
    return [p for p in files if not any(p.is_relative_to(s) for s in skipped) and ".egg-info" not in str(p)]


def test_every_install_command_names_mixit_transformers():
    files = documented_files()
    assert ROOT / "docs" / "scaling.md" in files and ROOT / "src" / "mixit" / "interop.py" in files
    wrong = {
        f"{p.relative_to(ROOT)}: pip install {name}"
        for p in files
        for name in installed_names(p.read_text())
        if name != DISTRIBUTION
    }
    assert not wrong, f"install commands that do not name {DISTRIBUTION}: {sorted(wrong)}"


def test_the_changelog_starts_with_this_version():
    headings = re.findall(r"^## (\S+) - \d{4}-\d{2}-\d{2}$", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert headings[0] == __version__
    assert headings == sorted(headings, key=lambda v: tuple(map(int, v.split("."))), reverse=True)
