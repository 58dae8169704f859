# `make run`: set everything up and reproduce the paper's comparison on the embedded data (<= 30 min, 2 cores).
# `make test`: set everything up, lint, type-check and run the whole test suite.
# torch is pinned here (not in pyproject) to the CPU wheel these machines carry;
# an unpinned torch would pull a multi-GB CUDA build onto a CPU-only machine.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

.PHONY: setup run test clean

$(BIN)/mixit: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(BIN)/mixit

setup: $(BIN)/mixit

# The main job: the paper's comparison at laptop scale, report in runs/study-quick/report.md.
run: setup
	$(BIN)/mixit reproduce --preset quick --out runs/study-quick

# Lint (ruff: rules and formatting) and types (mypy on src/) are part of the tests.
test: setup
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts
	$(BIN)/mypy
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/python -m pytest tests

clean:
	rm -rf $(VENV) runs
