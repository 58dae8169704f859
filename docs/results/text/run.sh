#!/usr/bin/env bash
# The runs of docs/text.md, then what a study file cannot ask for: three samples from each language model.
# Usage: docs/results/text/run.sh [OUT_DIR]   (default runs/text; about 75 minutes on 2 cores)
set -euo pipefail
out=${1:-runs/text}
here=$(dirname "$0")
mixit=${MIXIT:-mixit}
$mixit reproduce --study "$here/study-lm.toml" --no-progress --out "$out/lm"
$mixit reproduce --study "$here/study-sentiment.toml" --no-progress --out "$out/sentiment"
for run in "$out"/lm/runs/*/; do
  $mixit sample "$run" --prompt "It is a truth universally acknowledged" --num-samples 3 \
    --max-new-tokens 60 > "$run/samples.txt"
done
