#!/usr/bin/env bash
# The analysis issue's evidence (docs/analysis.md): standard, frozen_qk and mixit
# trained the same way on 1-hop induction (task defaults: alphabet 16, length 64,
# 1000 steps of batch 64, lr 1e-3, d_model 128, 2 layers, 4 heads; 1000 test
# sequences), each analysed with `mixit analyze`; then signal propagation at
# initialisation, with the standard settings, without MixiT's sink head, and
# with the signal-propagation (shaped) settings.
# Usage: scripts/analysis_runs.sh [OUT_DIR]   (default runs/analysis; about 75 minutes on 2 cores)
set -euo pipefail
out=${1:-runs/analysis}
mixit=${MIXIT:-mixit}
for variant in standard frozen_qk mixit; do
  $mixit train --task induction --variant "$variant" --test-size 1000 --out "$out/induction-$variant" --no-progress
  $mixit analyze "$out/induction-$variant"
done
# Attempts to get frozen_qk to form induction heads (none did; docs/analysis.md).
$mixit train --task induction --variant frozen_qk --steps 4000 --test-size 1000 --out "$out/induction-frozen_qk-4000steps" --no-progress
$mixit train --task induction --variant frozen_qk --lr 3e-3 --test-size 1000 --out "$out/induction-frozen_qk-lr3e-3" --no-progress
$mixit train --task induction --variant frozen_qk --init-std 0.05 --test-size 1000 --out "$out/induction-frozen_qk-init0.05" --no-progress
$mixit train --task induction --variant frozen_qk --n-heads 16 --test-size 1000 --out "$out/induction-frozen_qk-heads16" --no-progress
$mixit train --task induction --variant frozen_qk --n-layers 3 --test-size 1000 --out "$out/induction-frozen_qk-layers3" --no-progress
# Larger initialisation, so the frozen logits start at the scale a wider model would give them (docs/analysis.md).
$mixit train --task induction --variant frozen_qk --init-std 0.1 --test-size 1000 --out "$out/induction-frozen_qk-init0.1" --no-progress
$mixit train --task induction --variant frozen_qk --init-std 0.2 --test-size 1000 --out "$out/induction-frozen_qk-init0.2" --no-progress
for variant in standard frozen_qk mixit; do
  $mixit train --task induction --variant "$variant" --init-std 0.1 --steps 3000 --test-size 1000 \
    --out "$out/induction-$variant-init0.1-3000steps" --no-progress
done
for run in induction-frozen_qk-4000steps induction-frozen_qk-lr3e-3 induction-frozen_qk-init0.05 \
           induction-frozen_qk-heads16 induction-frozen_qk-layers3 induction-frozen_qk-init0.1 \
           induction-frozen_qk-init0.2 induction-standard-init0.1-3000steps induction-frozen_qk-init0.1-3000steps \
           induction-mixit-init0.1-3000steps; do
  $mixit analyze "$out/$run"
done
$mixit signal --variants standard,mixit,random --depths 2,4,8,16,32 --out "$out/signal"
$mixit signal --variants standard,mixit,random --depths 2,4,8,16,32 --no-mixing-sink --out "$out/signal-no-sink"
$mixit signal --variants standard,mixit,random --depths 2,4,8,16,32 --shaped --out "$out/signal-shaped"
