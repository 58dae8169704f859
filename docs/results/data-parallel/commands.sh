#!/usr/bin/env bash
cd /work/main
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
rm -rf /tmp/dp-1 /tmp/dp-2
s=$(date +%s); .venv/bin/mixit train --task addition -p n_digits=5 --out /tmp/dp-1 --no-progress > /tmp/dp-1.log 2>&1; echo "rc1=$?" ; m=$(date +%s)
.venv/bin/torchrun --standalone --nproc-per-node 2 -m mixit train --task addition -p n_digits=5 --out /tmp/dp-2 --no-progress > /tmp/dp-2.log 2>&1; echo "rc2=$?"; e=$(date +%s)
echo "single_s=$((m-s)) torchrun2_s=$((e-m))"
