#!/usr/bin/env bash
# The measurements of docs/performance.md: every variant and the Hugging Face
# Llama baseline at the two CPU shapes, eager with a profile of one
# step per row, then the target shape compiled. About 20 minutes on 2 cores.
# Usage: docs/results/performance/run.sh [OUT_DIR]   (default runs/bench)
set -euo pipefail
out=${1:-runs/bench}
mixit=${MIXIT:-mixit}
mkdir -p "$out"
$mixit bench --profile --out "$out/target.json" | tee "$out/target.txt"
$mixit bench --d-model 128 --n-layers 2 --task addition -p n_digits=10 --batch-size 1000 --profile \
  --out "$out/algorithmic.json" | tee "$out/algorithmic.txt"
$mixit bench --compile --out "$out/target-compiled.json" | tee "$out/target-compiled.txt"
