# `make run`: set everything up and reproduce the paper's comparison on the embedded data under docs/protocol.md (hours on 2 cores).
# `make test`: set everything up, lint, type-check and run the whole test suite.
# `make package`: build the wheel and sdist, install the wheel into a fresh environment and run it from there.
# torch is pinned here (not in pyproject) to the CPU wheel these machines carry;
# an unpinned torch would pull a multi-GB CUDA build onto a CPU-only machine.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

.PHONY: setup run test package clean

# The distribution is mixit-transformers: a `mixit` distribution in the environment (this package under its
# name before 0.3.0, or PyPI's unrelated mixin library) would share the import name, so it is removed first.
$(BIN)/mixit: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	if $(BIN)/pip show -q mixit >/dev/null 2>&1; then $(BIN)/pip uninstall -q -y mixit; fi
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(BIN)/mixit

setup: $(BIN)/mixit

# The main job: the paper's comparison at laptop scale, report in runs/study-quick/report.md.
run: setup
	$(BIN)/mixit reproduce --preset quick --out runs/study-quick

# Lint (ruff: rules and formatting) and types (mypy on src/) are part of the tests. The tests run in one worker
# per core (pytest-xdist), each worker and what it starts with one torch thread (tests/conftest.py).
test: setup
	$(BIN)/ruff check src tests scripts examples docs/results
	$(BIN)/ruff format --check src tests scripts examples docs/results
	$(BIN)/mypy
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/python -m pytest tests -n auto --durations=15

# What a user installs: python -m build makes the sdist, then the wheel from the unpacked sdist;
# scripts/check_package.py checks both and installs the wheel into a fresh environment (docs/versioning.md).
package: setup
	rm -rf dist
	$(BIN)/python -m build --quiet --outdir dist .
	$(BIN)/python scripts/check_package.py dist --python $(PYTHON) --torch "$(TORCH)"

clean:
	rm -rf $(VENV) runs dist
