#!/usr/bin/env bash
# The determinism statement's measurement (docs/reproduction.md, "Determinism"): one small run trained twice
# with this CPU's own kernels and twice with AVX2 kernels only (ATen, MKL and oneDNN each held to AVX2, as on a
# CPU without AVX-512), then every run's final weights and test metrics compared.
# Usage: bash docs/results/determinism/run.sh OUT   (OUT: a scratch directory; results.json is written here)
set -euo pipefail
export OMP_NUM_THREADS=1  # one thread, as each worker of a study trains
out=${1:?usage: run.sh OUT}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
train() {
    mixit train --task dyck -p max_pairs=10 --variant standard --d-model 64 --n-heads 4 --n-layers 2 \
        --steps 100 --batch-size 64 --eval-every 50 --test-size 500 --progress false --out "$1" >/dev/null
}
train "$out/native-1"
train "$out/native-2"
ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 train "$out/avx2-1"
ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 train "$out/avx2-2"
python - "$out" "$here/results.json" <<'PY'
import hashlib, json, sys
from pathlib import Path

import torch
from safetensors.torch import load_file

out, dest = Path(sys.argv[1]), Path(sys.argv[2])
runs = ["native-1", "native-2", "avx2-1", "avx2-2"]
found = {}
for name in runs:
    run = out / name
    (weights,) = sorted(run.glob("checkpoints/*/model.safetensors"))[-1:]
    tensors = load_file(weights)
    digest = hashlib.sha256(b"".join(tensors[k].numpy().tobytes() for k in sorted(tensors))).hexdigest()[:16]
    summary = json.loads((run / "summary.json").read_text())
    found[name] = {"tensors": tensors, "sha256": digest, "test": summary["test"]}


def max_diff(a, b):
    return max(float((found[a]["tensors"][k] - found[b]["tensors"][k]).abs().max()) for k in found[a]["tensors"])


record = {
    "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    "torch": torch.__version__,
    "weights_sha256": {n: found[n]["sha256"] for n in runs},
    "max_abs_weight_difference": {
        "native-1 vs native-2": max_diff("native-1", "native-2"),
        "avx2-1 vs avx2-2": max_diff("avx2-1", "avx2-2"),
        "native-1 vs avx2-1": max_diff("native-1", "avx2-1"),
    },
    "test": {n: {k: found[n]["test"][k] for k in ("loss", "token_acc")} for n in runs},
}
dest.write_text(json.dumps(record, indent=2) + "\n")
print(json.dumps(record, indent=2))
PY
