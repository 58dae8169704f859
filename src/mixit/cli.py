"""`mixit <subcommand>`: train, eval, sample, analyze, signal, bench, list.

Bad input (an unknown task, a value out of range, a run directory holding
another run, a corrupt checkpoint) is refused before any work with one line on
stderr naming the problem and what is allowed, and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, Sequence

from mixit import __version__
from mixit.errors import UsageError
from mixit.freezing import VARIANTS
from mixit.runtime import tune_allocator

VARIANT_NAMES = tuple(VARIANTS)


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# CLI flag -> RunConfig override name, for the options that map one to one.
MODEL_FLAGS = {
    "d_model": int, "n_layers": int, "n_heads": int, "d_mlp": int, "n_ctx": int,
    "attention": str, "mixing_alpha": float, "init_std": float, "seed": int, "pooling": str, "causal": _bool,
}
TRAIN_FLAGS = {
    "steps": int, "batch_size": int, "lr": float, "weight_decay": float, "warmup_steps": int,
    "grad_clip": float, "eval_every": int, "checkpoint_every": int, "log_every": int,
    "data_seed": int, "test_size": int,
}
FLAG_HELP = {
    "d_model": "model width (128)", "n_layers": "number of blocks (2)",
    "n_heads": "attention heads, must divide d_model (4)", "d_mlp": "MLP hidden size (4 * d_model)",
    "n_ctx": "longest sequence the model is built for (the task's input length)",
    "attention": "attention kind: softmax or mixing (set by the variant; only 'random' may change it)",
    "mixing_alpha": "MixiT scale of the centred random part (1.0)",
    "init_std": "std of the normal initialisation of weights and embeddings (0.02)", "seed": "model initialisation seed (0)",
    "pooling": "classifier pooling over real tokens: last or mean (last; sentiment only)",
    "causal": "true or false: causal attention (true; sentiment: false for mixit, as the reference)",
    "steps": "optimizer steps (task default)", "batch_size": "examples per step (task default)",
    "lr": "peak learning rate (task default)", "weight_decay": "AdamW weight decay on matrices (0.01)",
    "warmup_steps": "linear warmup steps (min(100, steps/10))", "grad_clip": "global grad-norm clip, 0 = off (1.0)",
    "eval_every": "evaluate on the test set every N steps (steps/10)",
    "checkpoint_every": "checkpoint every N steps (steps/4)", "log_every": "log the training loss every N steps",
    "data_seed": "seed of the test set and training stream (0)", "test_size": "test-set size (4000)",
}


class Parser(argparse.ArgumentParser):
    """argparse that reports an error as one line and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _task_param(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. n_digits=5), got {text!r}")
    return key.strip(), value.strip()


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _name_list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def build_parser() -> Parser:
    parser = Parser(prog="mixit", description="Train and compare transformers with frozen or random parts.")
    parser.add_argument("--version", action="version", version=f"mixit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    tr = sub.add_parser("train", help="train one model on one task",
                        description="Train one variant on one task; writes a run directory.")
    tr.add_argument("--task", help="task name (addition); see `mixit list`")
    tr.add_argument("--variant", help="standard, frozen_qk, frozen_mlp, mixit or random (standard)")
    tr.add_argument("-p", "--task-param", action="append", type=_task_param, default=[], metavar="KEY=VALUE",
                    help="task parameter, repeatable (e.g. -p n_digits=5); see `mixit list`")
    for name, kind in {**MODEL_FLAGS, **TRAIN_FLAGS}.items():
        tr.add_argument("--" + name.replace("_", "-"), type=kind, help=FLAG_HELP[name])
    tr.add_argument("--no-sink", dest="mixing_sink", action="store_const", const=False,
                    help="MixiT without the reference's sink head (head 0 = 0.5 I + 0.5 on token 0)")
    tr.add_argument("--shaped", action="store_true",
                    help="signal-propagation settings: residual sqrt(1/2), shaped LeakyReLU, width scaling")
    tr.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N")
    tr.add_argument("--out", type=Path, help="run directory (runs/<task>-<variant>-<time>)")
    tr.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    tr.add_argument("--quiet", action="store_true", help="no progress bar")
    tr.add_argument("--compile", action="store_true", help="torch.compile the training forward pass")

    ev = sub.add_parser("eval", help="re-evaluate a run's checkpoint on its test set",
                        description="Load RUN_DIR's latest checkpoint and evaluate it on the task's fixed test set.")
    ev.add_argument("run_dir", type=Path)
    ev.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    ev.add_argument("--batch-size", type=int, default=1000, help="examples per forward pass (1000)")

    sm = sub.add_parser("sample", help="sample text from a trained language model (task lm)",
                        description="Continue a prompt with text sampled from RUN_DIR's latest checkpoint.")
    sm.add_argument("run_dir", type=Path)
    sm.add_argument("--prompt", default="", help="text to continue (empty: start a new document)")
    sm.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate at most (200)")
    sm.add_argument("--temperature", type=float, default=0.8, help="sampling temperature, 0 = greedy (0.8)")
    sm.add_argument("--top-k", type=int, default=50, help="sample among the k most likely tokens, 0 = all (50)")
    sm.add_argument("--num-samples", type=int, default=1, help="independent continuations (1)")
    sm.add_argument("--seed", type=int, default=0, help="sampling seed (0)")
    sm.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")

    an = sub.add_parser("analyze", help="head scores, attention maps and signal propagation of a trained run",
                        description="Write RUN_DIR/analysis/: head scores (previous-token, induction, "
                                    "duplicate-token), the in-context gap, attention maps, the MixiT matrices, "
                                    "token similarity per layer, and a summary.md.")
    an.add_argument("run_dir", type=Path)
    an.add_argument("--example", type=int, default=0, help="test example whose attention maps are drawn (0)")
    an.add_argument("--tokens", type=_int_list, help="draw the attention maps of these token ids instead, "
                                                       "comma-separated (e.g. 3,2,1,10,9)")
    an.add_argument("--batch", type=int, default=64, help="repeated random sequences for the head scores (64)")
    an.add_argument("--seed", type=int, default=0, help="seed of those sequences (0)")
    an.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")

    sg = sub.add_parser("signal", help="token similarity against depth at initialisation (rank collapse)",
                        description="Measure, for freshly initialised models, the mean cosine similarity and "
                                    "covariance between token representations after each layer, for several "
                                    "variants and depths; write signal.json and signal.png.")
    sg.add_argument("--variants", type=_name_list, default=["standard", "mixit", "random"],
                    help="comma-separated variants (standard,mixit,random)")
    sg.add_argument("--depths", type=_int_list, default=[2, 4, 8, 16, 32], help="comma-separated depths (2,4,8,16,32)")
    sg.add_argument("--d-model", type=int, default=128, help="width (128)")
    sg.add_argument("--n-heads", type=int, default=4, help="heads (4)")
    sg.add_argument("--n-ctx", type=int, default=64, help="sequence length of the random inputs (64)")
    sg.add_argument("--seeds", type=int, default=3, help="initialisations averaged per point (3)")
    sg.add_argument("--shaped", action="store_true", help="use the signal-propagation settings")
    sg.add_argument("--no-sink", action="store_true",
                    help="MixiT without the reference's sink head (head 0 = 0.5 I + 0.5 on token 0)")
    sg.add_argument("--out", type=Path, default=Path("signal"), help="output directory (./signal)")

    bn = sub.add_parser("bench", help="training throughput, memory and MFU per variant, beside HF Llama",
                        description="Time training steps of every variant at one model shape (median of "
                                    "repeats after warm-up), with tokens/s, peak memory and model FLOPs "
                                    "utilisation against this device's measured matmul peak, beside a Hugging "
                                    "Face Llama of the same shape; print a table and write JSON.")
    bn.add_argument("--variants", type=_name_list, default=list(VARIANT_NAMES),
                    help=f"comma-separated variants ({','.join(VARIANT_NAMES)})")
    bn.add_argument("--d-model", type=int, default=256, help="width (256)")
    bn.add_argument("--n-layers", type=int, default=4, help="blocks (4)")
    bn.add_argument("--n-heads", type=int, default=4, help="heads (4)")
    bn.add_argument("--vocab-size", type=int, help="vocabulary (512, or the task's)")
    bn.add_argument("--seq-len", type=int, help="tokens per sequence (128, or what the task's model reads)")
    bn.add_argument("--batch-size", type=int, default=64, help="sequences per step (64)")
    bn.add_argument("--task", help="take vocabulary and sequence length from this task and measure how long "
                                   "one of its training batches takes to generate")
    bn.add_argument("-p", "--task-param", action="append", type=_task_param, default=[], metavar="KEY=VALUE",
                    help="task parameter, repeatable (with --task)")
    bn.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    bn.add_argument("--dtype", default="fp32", help="fp32, or bf16 (autocast; cuda only)")
    bn.add_argument("--compile", action="store_true", help="torch.compile the models")
    bn.add_argument("--warmup", type=int, default=3, help="untimed steps first, during which peak memory is measured (3)")
    bn.add_argument("--steps", type=int, default=3, help="steps per timed block (3)")
    bn.add_argument("--repeats", type=int, default=5, help="timed blocks; the median is reported (5)")
    bn.add_argument("--no-baseline", action="store_true", help="skip the Hugging Face Llama row")
    bn.add_argument("--profile", action="store_true",
                    help="after timing, profile one more step of each row and print where its time goes")
    bn.add_argument("--out", type=Path, help="JSON file to write (runs/bench-<time>.json); never overwritten")

    ls = sub.add_parser("list", help="list tasks, variants and their parameters")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out = {name: getattr(args, name) for name in {**MODEL_FLAGS, **TRAIN_FLAGS} if getattr(args, name) is not None}
    if args.mixing_sink is not None:
        out["mixing_sink"] = args.mixing_sink
    if args.shaped:
        from mixit.config import ModelConfig
        out = {**ModelConfig.shaped(), **out}
    return out


def cmd_train(args: argparse.Namespace) -> int:
    from mixit.train import checkpoint as ckpt
    from mixit.train.loop import run_config, train

    task_params = dict(args.task_param)
    overrides = _overrides(args)
    if args.resume:
        if args.out is None:
            raise UsageError("--resume needs --out RUN_DIR, the run to continue")
        cfg = ckpt.load_config(args.out)
        requested = run_config(args.task or cfg.task, args.variant or cfg.variant, {**cfg.task_params, **task_params},
                               **{**_saved_overrides(cfg), **overrides})
    else:
        cfg = requested = run_config(args.task or "addition", args.variant or "standard", task_params, **overrides)
    out = args.out or Path("runs") / f"{cfg.task}-{cfg.variant}-{time.strftime('%Y%m%d-%H%M%S')}"
    summary = train(requested, out, device=args.device, resume=args.resume, progress=not args.quiet,
                    compile=args.compile)
    print(_format_summary(summary))
    return 0


def _saved_overrides(cfg) -> dict[str, Any]:
    """A saved RunConfig as run_config() overrides, so a resumed run rebuilds it exactly."""
    d = cfg.to_dict()
    model = {k: v for k, v in d["model"].items() if k != "vocab_size"}
    return {**model, **d["train"], "data_seed": cfg.data_seed, "test_size": cfg.test_size}


def _format_summary(summary: dict[str, Any]) -> str:
    metrics = "  ".join(f"{k} {v:.4f}" for k, v in summary["test"].items() if isinstance(v, float))
    return (f"{summary['task']} {summary['variant']}: after {summary['steps']} steps, test {metrics}\n"
            f"run directory: {summary['run_dir']}")


def cmd_eval(args: argparse.Namespace) -> int:
    from mixit.train import checkpoint as ckpt
    from mixit.train.evaluate import evaluate
    from mixit.train.loop import build, resolve_device

    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be a positive integer, got {args.batch_size}")
    if not args.run_dir.is_dir():
        raise UsageError(f"run directory {args.run_dir} does not exist")
    cfg = ckpt.load_config(args.run_dir)
    last = ckpt.latest_checkpoint(args.run_dir)
    if last is None:
        raise UsageError(f"{args.run_dir} has no checkpoint yet")
    device = resolve_device(args.device)
    task, model, _ = build(cfg, args.run_dir)
    ckpt.load_model_state(last, model)
    metrics = evaluate(model.to(device), task, device, args.batch_size)
    print(json.dumps({"run_dir": str(args.run_dir), "checkpoint": last.name, "task": task.describe(),
                      "variant": cfg.variant, "test": metrics}, indent=2))
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    from mixit.generate import sample_run

    texts = sample_run(args.run_dir, args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                       top_k=args.top_k or None, num_samples=args.num_samples, seed=args.seed, device=args.device)
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"--- sample {i + 1}")
        print(args.prompt + text)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from mixit.freezing import VARIANTS
    from mixit.tasks import TASKS, task_parameters

    tasks = {name: {"description": cls.description, "parameters": task_parameters(name),
                    "train_defaults": cls.default_train} for name, cls in TASKS.items()}
    variants = {name: {"attention": v.attention, "description": v.description} for name, v in VARIANTS.items()}
    if args.json:
        print(json.dumps({"tasks": tasks, "variants": variants}, indent=2))
        return 0
    print("tasks (pass parameters with -p KEY=VALUE):")
    for name, info in tasks.items():
        params = ", ".join(f"{k}={v}" for k, v in info["parameters"].items())
        print(f"  {name:<17} {info['description']}\n  {'':<17} parameters: {params}")
    print("variants (--variant):")
    for name, info in variants.items():
        print(f"  {name:<17} [{info['attention']}] {info['description']}")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from mixit.analysis.report import analyze_run

    if args.batch < 1:
        raise UsageError(f"--batch must be a positive integer, got {args.batch}")
    analyze_run(args.run_dir, device=args.device, example=args.example, tokens=args.tokens,
                           batch=args.batch, seed=args.seed)
    print((args.run_dir / "analysis" / "summary.md").read_text().strip())
    print(f"\nwritten to {args.run_dir / 'analysis'}")
    return 0


def cmd_signal(args: argparse.Namespace) -> int:
    from mixit.analysis.signal import plot_signal, signal_propagation

    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {args.out} exists and is not a directory")
    for name in ("signal.json", "signal.png"):
        if (args.out / name).exists():
            raise UsageError(f"{args.out / name} already exists; choose another --out")
    result = signal_propagation(args.variants, args.depths, d_model=args.d_model, n_heads=args.n_heads,
                                n_ctx=args.n_ctx, seeds=tuple(range(args.seeds)), shaped=args.shaped,
                                model_overrides={"mixing_sink": False} if args.no_sink else None)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "signal.json").write_text(json.dumps(result, indent=2) + "\n")
    plot_signal(result, args.out / "signal.png")
    print("variant      " + "".join(f"{d:>9}" for d in args.depths) + "   (mean token cosine after the last layer)")
    for variant, by_depth in result["results"].items():
        print(f"{variant:<12} " + "".join(f"{by_depth[str(d)]['cosine']:>9.4f}" for d in args.depths))
    print(f"written to {args.out / 'signal.json'} and {args.out / 'signal.png'}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from mixit.bench import Shape, format_profiles, format_table, run_bench
    from mixit.tasks import make_task

    out = args.out or Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    if out.exists():
        raise UsageError(f"{out} already exists; choose another --out")
    if args.task_param and args.task is None:
        raise UsageError("-p/--task-param needs --task")
    seq_len, vocab_size = 128, 512
    if args.task is not None:
        task = make_task(args.task, dict(args.task_param))
        seq_len, vocab_size = task.input_len, task.vocab_size
    shape = Shape(d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                  vocab_size=args.vocab_size or vocab_size, seq_len=args.seq_len or seq_len,
                  batch_size=args.batch_size)
    result = run_bench(shape, args.variants, device=args.device, dtype=args.dtype, warmup=args.warmup,
                       steps=args.steps, repeats=args.repeats, compile=args.compile, baseline=not args.no_baseline,
                       task=args.task, task_params=dict(args.task_param), profile=args.profile,
                       progress=lambda message: print(f"... {message}", file=sys.stderr, flush=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result))
    if args.profile:
        print(format_profiles(result))
    print(f"written to {out}")
    return 0


COMMANDS = {"train": cmd_train, "bench": cmd_bench, "eval": cmd_eval, "sample": cmd_sample, "analyze": cmd_analyze,
            "signal": cmd_signal, "list": cmd_list}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, or a parse error already reported on one line
        return int(e.code or 0)
    tune_allocator()
    try:
        return COMMANDS[args.command](args)
    except UsageError as e:
        print(f"mixit {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mixit: interrupted; a run continues from its last checkpoint with --resume --out RUN_DIR",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
