#!/usr/bin/env bash
# The GPU records of docs/performance.md ("On a GPU") and docs/reproduction.md ("On a GPU"), one stage at a time:
#
#   docs/results/gpu_records.sh OUT STAGE...      STAGE: env, tests, bench, compiled, table4, table4-epochs, depth,
#                                                        converge, depth-seeds
#
# run from a checkout (or a copy of one: set MIXIT_COMMIT to its commit) on a machine with a CUDA GPU and a
# CUDA build of PyTorch. Each stage writes OUT/STAGE/ (the study stages leave out checkpoints) and its command
# lines to OUT/STAGE/command.txt.
set -u
out=$1
shift
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
DEVICE=${DEVICE:-cuda}  # cpu for a rehearsal
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

# Train one run in the background, its command and log in the stage directory: $1 stage dir, $2 run name, rest flags.
train_bg() {
    local dir=$1 name=$2
    shift 2
    echo "\$ mixit train $* --device $DEVICE --keep-checkpoints latest --no-progress --out $dir/$name" >>"$dir/command.txt"
    python3 -m mixit train "$@" --device "$DEVICE" --keep-checkpoints latest --no-progress --out "$dir/$name" \
        >"$dir/$name.log" 2>&1 &  # python3 itself, not the function: $! is then the process to stop
    pids[$name]=$!
}

# The cells a laptop cannot settle, in one call of a limited length. Table 4 at 500 epochs first (the three
# variants the last GPU call cut short; standard was complete), three at once; the depth runs beside them, the
# random transformer at 8 layers from the start and the rest as Table 4's runs end. Every run still going at
# DEADLINE seconds is stopped and recorded as cut: SIGTERM, since a script's background jobs ignore SIGINT; its
# metrics so far are kept. SCALE=tiny DEVICE=cpu is the rehearsal of the same script on a CPU.
converge_stage() {
    local dir=$1 deadline=${DEADLINE:-470} t4=(-p n=512 --d-model 128 --steps 4000 --eval-every 250)
    local add=(-p n_digits=10 --steps 10000 --eval-every 500 --early-stop --patience 4 --dtype bf16)
    if [[ ${SCALE:-full} == tiny ]]; then
        t4=(-p n=16 --d-model 32 --steps 40 --eval-every 10 --batch-size 64)
        add=(-p n_digits=3 --d-model 64 --steps 400 --eval-every 20 --early-stop --patience 4 --batch-size 32)
    fi
    declare -gA pids=()
    for variant in frozen_qk mixit frozen_mlp; do
        train_bg "$dir" "table4-$variant" --task memorization --recipe reference "${t4[@]}" --n-heads 4 \
            --n-layers 2 --variant "$variant" --seed 0
    done
    train_bg "$dir" depth-random-8 --task addition --recipe reference "${add[@]}" --variant random --n-layers 8 --seed 0
    local started=0
    while ((SECONDS - STAGE_START < deadline)); do
        local running=0
        for name in "${!pids[@]}"; do kill -0 "${pids[$name]}" 2>/dev/null && running=$((running + 1)); done
        if ((!started)) && ! kill -0 "${pids[table4-frozen_qk]}" "${pids[table4-mixit]}" "${pids[table4-frozen_mlp]}" \
            2>/dev/null; then
            echo "# depth runs started at $((SECONDS - STAGE_START)) s" >>"$dir/command.txt"
            train_bg "$dir" depth-random-2 --task addition --recipe reference "${add[@]}" --variant random \
                --n-layers 2 --seed 0
            for layers in 2 8; do  # 64 heads: the most of the reference's MixiT grid at width 512 (Table 5: more heads, higher)
                train_bg "$dir" "depth-mixit-$layers" --task addition --recipe reference "${add[@]}" --variant mixit \
                    --n-heads 64 --n-layers "$layers" --seed 0
            done
            started=1
        elif ((running == 0)); then
            break
        fi
        sleep 2
    done
    for name in "${!pids[@]}"; do
        if kill -0 "${pids[$name]}" 2>/dev/null; then
            kill -TERM "${pids[$name]}"
            echo "# $name cut at $((SECONDS - STAGE_START)) s" >>"$dir/command.txt"
        fi
    done
    wait
    for name in "${!pids[@]}"; do
        echo "== $name: $(tail -1 "$dir/$name/metrics.jsonl" 2>/dev/null | cut -c1-300)"
    done
}

# The random transformer at 8 layers on fresh seeds (the depth finding's open cell; docs/results/gpu-depth-seeds/
# protocol.md says what is read from it), one run at a time: a GPU shared between processes was slower than
# one after another (docs/results/gpu-converge). Each run gets an equal share of DEADLINE seconds and is stopped
# (SIGTERM, metrics kept) at the end of its share.
depth_seeds_stage() {
    local dir=$1 deadline=${DEADLINE:-520} seeds=(1 2)
    local add=(-p n_digits=10 --steps 10000 --eval-every 500 --early-stop --patience 4 --dtype bf16)
    [[ ${SCALE:-full} == tiny ]] && add=(-p n_digits=3 --d-model 64 --steps 4000 --eval-every 20 --early-stop \
        --patience 4 --batch-size 32)
    local share=$((deadline / ${#seeds[@]}))
    declare -gA pids=()
    for seed in "${seeds[@]}"; do
        local name=depth-random-8-seed$seed start=$SECONDS
        train_bg "$dir" "$name" --task addition --recipe reference "${add[@]}" --variant random --n-layers 8 --seed "$seed"
        while kill -0 "${pids[$name]}" 2>/dev/null && ((SECONDS - start < share)); do sleep 1; done
        if kill -0 "${pids[$name]}" 2>/dev/null; then
            kill -TERM "${pids[$name]}"
            echo "# $name cut after $((SECONDS - start)) s" >>"$dir/command.txt"
        fi
        wait "${pids[$name]}"
        echo "# $name exit $? after $((SECONDS - start)) s" >>"$dir/command.txt"
        echo "== $name: $(tail -1 "$dir/$name/metrics.jsonl" 2>/dev/null | cut -c1-300)"
    done
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
        converge) STAGE_START=$SECONDS converge_stage "$dir" ;;
        depth-seeds) depth_seeds_stage "$dir" ;;
        *) echo "unknown stage $stage; allowed: env, tests, bench, compiled, table4, table4-epochs, depth, converge, depth-seeds" >&2
           exit 2 ;;
    esac
done
