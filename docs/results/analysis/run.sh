#!/usr/bin/env bash
# The runs of docs/analysis.md (this directory's study files, every run analysed), then what a study file cannot
# ask for: signal propagation at initialisation with the standard settings, without MixiT's sink head, and with
# the signal-propagation (shaped) settings.
# Usage: docs/results/analysis/run.sh [OUT_DIR]   (default runs/analysis; about 75 minutes on 2 cores)
set -euo pipefail
out=${1:-runs/analysis}
here=$(dirname "$0")
mixit=${MIXIT:-mixit}
for study in "$here"/study*.toml; do
  $mixit reproduce --study "$study" --no-progress --out "$out/$(basename "$study" .toml)"
done
$mixit signal --variants standard,mixit,random --depths 2,4,8,16,32 --out "$out/signal"
$mixit signal --variants standard,mixit,random --depths 2,4,8,16,32 --mixing-sink off --out "$out/signal-no-sink"
$mixit signal --variants standard,mixit,random --depths 2,4,8,16,32 --shaped --out "$out/signal-shaped"
