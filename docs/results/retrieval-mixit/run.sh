#!/bin/sh
# Every run of summary.md, one at a time on one thread, from the repository root:
#   docs/results/retrieval-mixit/run.sh /tmp/retrieval-mixit
# With the project's virtualenv active; about 20 minutes on one shared CPU core. Writes the runs under $1 and the small records beside this script.
set -eu
OUT=${1:?usage: run.sh OUT_DIR}
HERE=docs/results/retrieval-mixit
export OMP_NUM_THREADS=1 PYTHONPATH=src HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
SHAPE="--model.d_model 64 --model.n_heads 4 --model.n_layers 2 --model.qk_init paper --train.batch_size 64"
train() {  # name max_pairs steps lr model-seed eval-every
    python -m mixit train --task retrieval --variant mixit -p max_pairs="$2" $SHAPE --train.steps "$3" \
        --train.lr "$4" --model.seed "$5" --train.eval_every "$6" --test_size 1000 --out "$OUT/$1" --no-progress
    python -m mixit analyze "$OUT/$1" --device cpu > /dev/null
}
train p10_s0 10 2000 1e-3 0 100
train p5_s0 5 2000 1e-3 0 100
train p10_long_s0 10 8000 3e-3 0 500
python "$HERE/which_pair.py" "$HERE/which_pair.json" "$OUT/p10_s0" "$OUT/p5_s0" "$OUT/p10_long_s0"
python "$HERE/forced_pairs.py" "$HERE/forced-k1-s0.json" mixit 1 500 1e-3 0
python "$HERE/forced_pairs.py" "$HERE/forced-k1-s1.json" mixit 1 500 1e-3 1
python "$HERE/forced_pairs.py" "$HERE/forced-k2-s0.json" mixit 2 1000 1e-3 0
python "$HERE/forced_pairs.py" "$HERE/forced-k1to10-s0.json" mixit 1,2,3,4,5,6,7,8,9,10 2000 1e-3 0
