#!/usr/bin/env bash
# The GPU records of docs/performance.md ("On a GPU") and docs/reproduction.md ("On a GPU"), one stage at a time:
#
#   docs/results/gpu_records.sh OUT STAGE...      STAGE: env, tests, bench, compiled, table4, table4-epochs, depth
#
# run from a checkout (or a copy of one: set MIXIT_COMMIT to its commit) on a machine with a CUDA GPU and a
# CUDA build of PyTorch. Each stage writes OUT/STAGE/ (the study stages leave out checkpoints) and its command
# lines to OUT/STAGE/command.txt.
set -u
out=$1
shift
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
mixit() { python3 -m mixit "$@"; }
# Run a command, recording it and its exit status in the stage's command.txt.
record() {
    local dir=$1
    shift
    echo "\$ $*" >>"$dir/command.txt"
    local start=$SECONDS
    "$@"
    local status=$?
    echo "# exit $status after $((SECONDS - start)) s" >>"$dir/command.txt"
}

env_stage() {
    python3 - "$1/env.json" <<'EOF'
import json, os, platform, subprocess, sys
import torch
from mixit.version import __version__, git_commit
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit",
                      "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
info = {"gpu": torch.cuda.get_device_name(0), "nvidia_smi": smi, "torch": torch.__version__,
        "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
        "mixit": __version__, "git_commit": git_commit(), "cpus": os.cpu_count()}
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(json.dumps(info))
EOF
}

tests_stage() {
    record "$1" python3 -m pytest -m cuda tests/test_cuda.py -v -p no:cacheprovider --durations=0 \
        >"$1/pytest.txt" 2>&1
    tail -3 "$1/pytest.txt"
    # Without deterministic algorithms: are two identical fp32 runs bit-identical on this GPU?
    record "$1" python3 - "$1/determinism.json" <<'EOF'
import json, sys, tempfile
import torch
from safetensors.torch import load_file
from mixit import Run, run_config, train
cfg = run_config("addition", "standard", {"n_digits": 2}, d_model=64, n_heads=4, n_layers=2, steps=60,
                 batch_size=256, test_size=500)
tmp = tempfile.mkdtemp()
weights = []
for name in "ab":
    train(cfg, f"{tmp}/{name}", device="cuda", progress=False)
    weights.append(load_file(str(Run.open(f"{tmp}/{name}").latest_checkpoint() / "model.safetensors")))
a, b = weights
result = {"run": "addition n_digits=2, standard, d 64, 2 layers, 60 steps, fp32, twice, default algorithms",
          "bit_identical": all(torch.equal(a[k], b[k]) for k in a),
          "max_abs_difference": max(float((a[k] - b[k]).abs().max()) for k in a)}
json.dump(result, open(sys.argv[1], "w"), indent=1)
print(result)
EOF
}

bench_stage() {
    record "$1" mixit bench --device cuda --dtype bf16 --d-model 1024 --n-layers 12 --n-heads 16 --seq-len 256 \
        --batch-size 64 --steps 10 --repeats 10 --profile --out "$1/lm-bf16.json" >"$1/lm-bf16.txt" 2>&1
    record "$1" mixit bench --device cuda --dtype bf16 --d-model 512 --n-layers 2 --n-heads 4 --task addition \
        -p n_digits=10 --batch-size 1000 --steps 20 --repeats 10 --profile --out "$1/algorithmic-bf16.json" \
        >"$1/algorithmic-bf16.txt" 2>&1
    grep -h -A8 "^mixit bench" "$1"/*.txt
    grep -h "GPU busy" "$1"/*.txt
}

compiled_stage() {  # the rows the targets compare; each compiles for about a minute
    record "$1" mixit bench --device cuda --dtype bf16 --d-model 512 --n-layers 2 --n-heads 4 --task addition \
        -p n_digits=10 --batch-size 1000 --steps 20 --repeats 10 --compile --variants standard,frozen_qk,mixit \
        --out "$1/algorithmic-bf16-compiled.json" >"$1/algorithmic-bf16-compiled.txt" 2>&1
    record "$1" mixit bench --device cuda --dtype bf16 --d-model 1024 --n-layers 12 --n-heads 16 --seq-len 256 \
        --batch-size 64 --steps 10 --repeats 10 --compile --variants standard,frozen_qk,mixit \
        --out "$1/lm-bf16-compiled.json" >"$1/lm-bf16-compiled.txt" 2>&1
    grep -h -A8 "^mixit bench" "$1"/*.txt
}

study_stage() {  # $1: stage directory, $2: the study file
    cp "$2" "$1/study.toml"
    record "$1" mixit reproduce --study "$2" --workers 4 --threads 2 --no-progress --out "$1/study" \
        >"$1/reproduce.txt" 2>&1
    tail -5 "$1/reproduce.txt"
}

for stage in "$@"; do
    dir=$out/$stage
    mkdir -p "$dir"
    echo "== $stage"
    case $stage in
        env) env_stage "$dir" ;;
        tests) tests_stage "$dir" ;;
        bench) bench_stage "$dir" ;;
        compiled) compiled_stage "$dir" ;;
        table4) study_stage "$dir" docs/results/gpu-table4/study.toml ;;
        table4-epochs) study_stage "$dir" docs/results/gpu-table4-epochs/study.toml ;;
        depth) study_stage "$dir" docs/results/gpu-depth/study.toml ;;
        *) echo "unknown stage $stage; allowed: env, tests, bench, compiled, table4, table4-epochs, depth" >&2; exit 2 ;;
    esac
done
