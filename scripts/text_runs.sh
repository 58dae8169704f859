#!/usr/bin/env bash
# The real-text issue's evidence (docs/text.md): standard, frozen_qk and mixit
# language models on the embedded English corpus with equal budgets (task
# defaults: length 128, BPE vocabulary 4096, d_model 128, 4 layers, 4 heads,
# 2000 steps of 32 sequences, lr 2e-3), a few samples from each, then the same
# three variants on the embedded movie-snippet sentiment data (task defaults:
# length 64, vocabulary 2048, d_model 128, 2 layers, 1000 steps of 64, lr 1e-3).
# Usage: scripts/text_runs.sh [OUT_DIR]   (default runs/text; about 75 minutes on 2 cores)
set -euo pipefail
out=${1:-runs/text}
mixit=${MIXIT:-mixit}
for variant in standard frozen_qk mixit; do
  $mixit train --task lm --variant "$variant" --out "$out/lm-$variant" --no-progress
  $mixit sample "$out/lm-$variant" --prompt "It is a truth universally acknowledged" --num-samples 3 \
    --max-new-tokens 60 > "$out/lm-$variant/samples.txt"
  $mixit analyze "$out/lm-$variant" > /dev/null
done
for variant in standard frozen_qk mixit; do
  $mixit train --task sentiment --variant "$variant" --out "$out/sentiment-$variant" --no-progress
done
# The same three with mean pooling instead of the last token (docs/text.md: MixiT needs it).
for variant in standard frozen_qk mixit; do
  $mixit train --task sentiment --variant "$variant" --pooling mean --out "$out/sentiment-mean-$variant" --no-progress
done
