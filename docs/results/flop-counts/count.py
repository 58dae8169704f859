"""The FLOPs of one training step, counted two ways, at the shapes of docs/performance.md: by the hand formulas
`mixit bench` used until commit 534774d (`step_flops`, `hf_step_flops`, `linear_flops` of its bench.py) and by
`torch.utils.flop_counter.FlopCounterMode`, as `mixit bench` counts them now (`bench_variant`, `bench_hf`).

    PYTHONPATH=src nice -n 5 python docs/results/flop-counts/count.py docs/results/flop-counts/results.json

The old bench.py is not kept in the repository: it is read from `git archive` of that commit into a temporary
directory and imported there by a child process (`--old`), since the old code and the current code are both the
package `mixit`. Every matrix product of a step is linear in the batch (B rows of tokens through each linear layer,
B independent attention patterns), so the new count is taken at batch SMALL_BATCH and multiplied up; at the
target shape it is also taken at the full batch, and the two must agree exactly.
"""

import argparse
import dataclasses
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

OLD_COMMIT = "534774d94e844cbbbcebe870b47135b5f64f9778"  # the parent of 405df1c, which removed the formulas
SMALL_BATCH = 2
FULL_BATCH_CHECK = "target"
ADDITION = {"task": "addition", "task_params": {"n_digits": 10}, "batch_size": 1000}  # sets vocabulary and length
# name -> the `mixit bench` options of the runs in docs/performance.md
SHAPES: dict[str, dict[str, Any]] = {
    "target": {},
    "algorithmic": {"d_model": 128, "n_layers": 2, **ADDITION},
    "gpu_algorithmic": {"d_model": 512, "n_layers": 2, "n_heads": 4, **ADDITION},
    "gpu_lm": {"d_model": 1024, "n_layers": 12, "n_heads": 16, "seq_len": 256, "batch_size": 64},
}


def old_counts(shapes: dict[str, dict[str, int]]) -> dict[str, dict[str, dict[str, int]]]:
    """The old formulas' counts: whole step and linear layers alone (run with the old commit's src on the path)."""
    from mixit.bench import HF_NAME, Shape, hf_llama, hf_step_flops, linear_flops, step_flops
    from mixit.freezing import VARIANTS, apply_variant
    from mixit.models import Transformer

    counts: dict[str, dict[str, dict[str, int]]] = {}
    for name, fields in shapes.items():
        shape = Shape(**fields)
        counts[name] = {}
        for variant in VARIANTS.names():
            model = Transformer(shape.model_config(variant))
            apply_variant(model, variant)
            counts[name][variant] = {"flops": step_flops(model, shape), "linear": linear_flops(model, shape.tokens)}
        hf = hf_llama(shape)
        counts[name][HF_NAME] = {"flops": hf_step_flops(hf, shape), "linear": linear_flops(hf, shape.tokens)}
    return counts


def new_counts(shape: Any, full_batch: bool) -> dict[str, dict[str, int]]:
    """`mixit bench`'s counts now, at SMALL_BATCH times batch / SMALL_BATCH; with `full_batch`, also at the batch."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from mixit.bench import HF_NAME, bench_hf, bench_variant
    from mixit.freezing import VARIANTS
    from mixit.precision import Precision

    precision = Precision("fp32", torch.device("cpu"))
    scale, rest = divmod(shape.batch_size, SMALL_BATCH)
    assert rest == 0, f"batch {shape.batch_size} is not a multiple of {SMALL_BATCH}"
    small = dataclasses.replace(shape, batch_size=SMALL_BATCH)
    counts: dict[str, dict[str, int]] = {}
    for name in [*VARIANTS.names(), HF_NAME]:
        # An outer, plain counter sees the ops of the step bench counts under its own, for the linear layers'
        # share (mm, addmm; it counts CPU SDPA as 0).
        with FlopCounterMode(display=False) as by_op:
            row = bench_hf(small, precision) if name == HF_NAME else bench_variant(name, small, precision)
        assert row is not None, "the baseline needs transformers"
        ops = by_op.get_flop_counts()["Global"]
        linear = ops.get(torch.ops.aten.mm, 0) + ops.get(torch.ops.aten.addmm, 0)
        counts[name] = {"flops": row.flops * scale, "linear": linear * scale}
        if full_batch:
            row = bench_hf(shape, precision) if name == HF_NAME else bench_variant(name, shape, precision)
            assert row is not None
            counts[name]["flops_full_batch"] = row.flops
    return counts


def old_source(directory: str) -> str:
    """Unpack the old commit's src/ into `directory`; return the path to put first on PYTHONPATH."""
    root = Path(__file__).resolve().parents[3]
    tar = subprocess.run(["git", "-C", str(root), "archive", OLD_COMMIT, "src"], capture_output=True, check=True)
    tarfile.open(fileobj=io.BytesIO(tar.stdout)).extractall(directory, filter="data")
    return os.path.join(directory, "src")


def main() -> None:
    parser = argparse.ArgumentParser(description="Count FLOPs per training step, old formulas against FlopCounterMode.")
    parser.add_argument("out", type=Path, help="the JSON file to write (never overwritten)")
    parser.add_argument("--old", action="store_true", help="child process: read shapes from stdin, write old counts")
    args = parser.parse_args()
    if args.old:
        args.out.write_text(json.dumps(old_counts(json.load(sys.stdin))))
        return
    if args.out.exists():
        parser.error(f"{args.out} already exists; name a file that does not")

    import torch
    import transformers

    from mixit.bench import BenchOptions, shape_of
    from mixit.version import git_commit

    shapes = {name: shape_of(BenchOptions(**options)) for name, options in SHAPES.items()}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": old_source(tmp)}
        fields = json.dumps({name: dataclasses.asdict(shape) for name, shape in shapes.items()})
        old_file = Path(tmp) / "old.json"
        subprocess.run([sys.executable, __file__, "--old", str(old_file)], input=fields, text=True, env=env, check=True)
        old = json.loads(old_file.read_text())

    result: dict[str, Any] = {
        "old_commit": OLD_COMMIT,
        "new_commit": git_commit(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": "cpu, fp32 (CPU SDPA given the CUDA flash kernel's formula, as mixit bench does)",
        "small_batch": SMALL_BATCH,
        "shapes": {},
    }
    for name, shape in shapes.items():
        new = new_counts(shape, full_batch=name == FULL_BATCH_CHECK)
        rows = {}
        for variant, counts in new.items():
            before = old[name][variant]
            rows[variant] = {
                "old": before["flops"],
                "new": counts["flops"],
                "ratio": counts["flops"] / before["flops"],
                "old_linear": before["linear"],
                "new_linear": counts["linear"],
                **({"new_full_batch": counts["flops_full_batch"]} if "flops_full_batch" in counts else {}),
            }
            if "new_full_batch" in rows[variant] and rows[variant]["new_full_batch"] != counts["flops"]:
                sys.exit(f"count.py: {name} {variant}: batch {SMALL_BATCH} scaled differs from the full batch")
        result["shapes"][name] = {"bench_options": SHAPES[name], "shape": dataclasses.asdict(shape), "rows": rows}
        print(f"{name} done", file=sys.stderr, flush=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("| shape | variant | old GFLOP | new GFLOP | new - old | ratio | linear layers equal |")
    print("|---|---|---|---|---|---|---|")
    for name, entry in result["shapes"].items():
        for variant, row in entry["rows"].items():
            print(
                f"| {name} | {variant} | {row['old'] / 1e9:.1f} | {row['new'] / 1e9:.1f} | "
                f"{(row['new'] - row['old']) / 1e9:+.2f} | {row['ratio']:.3f} | "
                f"{'yes' if row['old_linear'] == row['new_linear'] else 'no'} |"
            )


if __name__ == "__main__":
    main()
