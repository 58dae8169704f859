#!/usr/bin/env bash
# The reference-fidelity rerun (docs/foundation.md, "With the reference's coupled settings"):
# the foundation comparison (5-digit addition, 10-pair retrieval, four variants, the laptop
# budget of each task) with the faithful defaults, then frozen Q/K on retrieval under the
# paper's query/key initialisation and under the reference recipe shortened to this machine.
# Usage: scripts/fidelity_runs.sh [OUT_DIR]   (default runs/fidelity; about 75 minutes on 2 cores)
set -euo pipefail
out=${1:-runs/fidelity}
mixit=${MIXIT:-mixit}
for variant in standard mixit frozen_qk frozen_mlp; do
  $mixit train --task addition -p n_digits=5 --variant "$variant" --out "$out/addition5-$variant" --no-progress
  $mixit train --task retrieval -p max_pairs=10 --variant "$variant" --out "$out/retrieval10-$variant" --no-progress
done
# One change at a time against the faithful MixiT: the normalised sink, and 32 heads.
$mixit train --task addition -p n_digits=5 --variant mixit --mixing-sink normalised \
  --out "$out/extra-addition5-mixit-normalised-sink" --no-progress
$mixit train --task addition -p n_digits=5 --variant mixit --n-heads 32 \
  --out "$out/extra-addition5-mixit-32heads" --no-progress
# Frozen Q/K initialised as the paper's text says, N(0, 1/d_model).
$mixit train --task retrieval -p max_pairs=10 --variant frozen_qk --qk-init paper \
  --out "$out/extra-retrieval10-frozen_qk-paper-init" --no-progress
# The reference recipe (width 512, lr 1e-2, weight decay 1e-3, AdamW beta2 0.999, cosine to 0), shortened:
# 800 steps of batch 128 with 80 warmup steps instead of 100,000 steps of batch 1000 with 500.
for variant in frozen_qk standard; do
  $mixit train --task retrieval -p max_pairs=10 --variant "$variant" --recipe reference \
    --steps 800 --batch-size 128 --warmup-steps 80 --out "$out/extra-retrieval10-$variant-reference-short" --no-progress
done
