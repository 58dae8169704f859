"""A/B timing of one training step under process-level settings that `mixit
bench` keeps fixed: glibc's malloc thresholds (`mixit.runtime.tune_allocator`)
and torch.compile. Each setting runs in fresh processes, alternated A, B, A, B
so that a slow spell of a shared machine does not fall on one side only; each
process reports the median of its timed steps, and this prints the median
over processes. It also times the elementwise multiply of two 32 MiB tensors,
the case the allocator setting is for.

    python docs/results/performance/step_ab.py --setting allocator --shape target
    python docs/results/performance/step_ab.py --setting compile --shape algorithmic
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

SHAPES = {
    "target": dict(d_model=256, n_layers=4, n_heads=4, vocab_size=512, seq_len=128, batch_size=64),
    "algorithmic": dict(d_model=128, n_layers=2, n_heads=4, vocab_size=31, seq_len=33, batch_size=1000),
}


def child(shape: str, variant: str, tune: bool, compile: bool, steps: int) -> dict[str, float]:
    from mixit.runtime import tune_allocator

    if tune:
        tune_allocator()
    import torch

    from mixit.bench import Shape, bench_variant
    from mixit.precision import Precision

    a, b = torch.randn(64, 128, 1024), torch.randn(64, 128, 1024)
    mul = []
    for _ in range(20):
        tick = time.perf_counter()
        a * b
        mul.append(time.perf_counter() - tick)
    contender = bench_variant(variant, Shape(**SHAPES[shape]), Precision("fp32", torch.device("cpu")), compile)
    for _ in range(3):
        contender.step()
    times = []
    for _ in range(steps):
        tick = time.perf_counter()
        contender.step()
        times.append(time.perf_counter() - tick)
    return {"step_ms": 1e3 * statistics.median(times), "mul_ms": 1e3 * statistics.median(mul[5:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=["allocator", "compile"], required=True)
    parser.add_argument("--shape", choices=list(SHAPES), default="target")
    parser.add_argument("--variant", default="standard")
    parser.add_argument("--rounds", type=int, default=3, help="processes per side (3)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per process (8)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.shape, args.variant, **json.loads(args.child), steps=args.steps)))
        return
    sides = {"off": {"tune": True, "compile": False}, "on": {"tune": True, "compile": True}}
    if args.setting == "allocator":
        sides = {"off": {"tune": False, "compile": False}, "on": {"tune": True, "compile": False}}
    results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for _ in range(args.rounds):
        for side, settings in sides.items():
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--setting",
                    args.setting,
                    "--shape",
                    args.shape,
                    "--variant",
                    args.variant,
                    "--steps",
                    str(args.steps),
                    "--child",
                    json.dumps(settings),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            results[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.setting} off/on, {args.variant}, {args.shape} shape, {args.rounds} processes per side:")
    for side, runs in results.items():
        steps = [r["step_ms"] for r in runs]
        muls = [r["mul_ms"] for r in runs]
        print(
            f"  {args.setting} {side:>3}: step {statistics.median(steps):7.1f} ms (per process "
            f"{', '.join(f'{s:.0f}' for s in steps)}); 32 MiB multiply {statistics.median(muls):5.2f} ms"
        )


if __name__ == "__main__":
    main()
