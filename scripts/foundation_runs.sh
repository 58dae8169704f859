#!/usr/bin/env bash
# The foundation issue's comparison: the four main variants on 5-digit addition
# and on retrieval with 10 pairs, each variant with the task's default budget:
# 1000 steps of batch 128, d_model 128, 2 layers, 4 heads; peak lr 3e-3 for
# addition and 1e-3 for retrieval. Then two extra MixiT runs on addition.
# Usage: scripts/foundation_runs.sh [OUT_DIR]   (default runs/foundation)
set -euo pipefail
out=${1:-runs/foundation}
mixit=${MIXIT:-mixit}
for variant in standard mixit frozen_qk frozen_mlp; do
  $mixit train --task addition -p n_digits=5 --variant "$variant" --out "$out/addition5-$variant" --no-progress
  $mixit train --task retrieval -p max_pairs=10 --variant "$variant" --out "$out/retrieval10-$variant" --no-progress
done
$mixit train --task addition -p n_digits=5 --variant mixit --skip-scale 0.7071067811865476 --branch-scale 0.7071067811865476 --activation shaped_leaky_relu --width-scaling --out "$out/extra-addition5-mixit-shaped" --no-progress
$mixit train --task addition -p n_digits=5 --variant mixit --n-heads 32 --out "$out/extra-addition5-mixit-32heads" --no-progress
