"""Text sampling from a trained language model (`mixit sample RUN_DIR`)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from tqdm.auto import tqdm

from mixit.core.models import Transformer
from mixit.core.resources import check_memory, inference_parts
from mixit.core.run import Run
from mixit.errors import UsageError
from mixit.runtime import resolve_device

MAX_NEW_TOKENS = 100_000
MAX_SAMPLES = 10_000


def check_sampling(temperature: float, top_k: int, max_new_tokens: int = 1, num_samples: int = 1) -> None:
    """Refuse sampling settings out of range, before any work."""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise UsageError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k < 0:
        raise UsageError(f"top_k must be >= 0 (0 = all), got {top_k}")
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise UsageError(f"max_new_tokens must be an integer in [1, {MAX_NEW_TOKENS:,}], got {max_new_tokens}")
    if not 1 <= num_samples <= MAX_SAMPLES:
        raise UsageError(f"num_samples must be an integer in [1, {MAX_SAMPLES:,}], got {num_samples}")


@torch.no_grad()
def generate(
    model: Transformer,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator | None = None,
    stop_token: int | None = None,
) -> torch.Tensor:
    """Extend `prompt` (B, T0) ids by up to `max_new_tokens` sampled tokens -> (B, T0 + n), stopping early once every
    row has produced `stop_token`. temperature 0 takes the most likely token; top_k > 0 samples among the k most
    likely. The model reads its last n_ctx tokens, with no key-value cache, which keeps every attention kind, MixiT
    included, on one code path."""
    check_sampling(temperature, top_k)
    was_training = model.training
    model.eval()
    out = prompt
    done = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    # A progress bar on stderr for long generations (stdout receives only the text).
    for _ in tqdm(range(max_new_tokens), desc="sampling", unit="tok", disable=None if max_new_tokens > 500 else True):
        logits = model(out[:, -model.cfg.n_ctx :])[:, -1].float()  # (B, vocab)
        if temperature == 0:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if 0 < top_k < logits.shape[-1]:
                kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)  # (B, 1)
        out = torch.cat([out, nxt], dim=1)
        if stop_token is not None:
            done |= nxt[:, 0] == stop_token
            if bool(done.all()):
                break
    model.train(was_training)
    return out


def sample_run(
    run_dir: Path,
    prompt: str = "",
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int = 50,
    num_samples: int = 1,
    seed: int = 0,
    device: str = "auto",
) -> list[str]:
    """Continue a prompt with text sampled from a language-model run's latest checkpoint; each continuation ends
    where the model ends its document (EOS) or after max_new_tokens.

    Args:
        run_dir: The run directory (a run of task lm).
        prompt: The text to continue; empty starts a new document.
        max_new_tokens: The most tokens to generate per continuation.
        temperature: Sampling temperature; 0 always takes the most likely token.
        top_k: Sample among the k most likely tokens; 0 means among all of them.
        num_samples: Independent continuations to sample.
        seed: Sampling seed.
        device: Where to run: auto (cuda if available, else cpu), cpu, cuda or cuda:N.
    """
    check_sampling(temperature, top_k, max_new_tokens, num_samples)
    run = Run.open(run_dir)
    # The model reads at most n_ctx tokens at a time: num_samples rows of n_ctx, without gradients.
    parts = inference_parts(run.config.model, num_samples, f"{num_samples} rows of activations")
    check_memory("sampling", parts, resolve_device(device), "lower num_samples")
    loaded = run.load(device)
    tokenizer = getattr(loaded.task, "tokenizer", None)
    if tokenizer is None or loaded.cfg.model.head != "lm":
        raise UsageError(f"{run_dir} is a {loaded.cfg.task} run; sampling needs a language-model run (--task lm)")
    eos = tokenizer.eos_id
    ids = tokenizer.encode(prompt) or [eos]  # an empty prompt starts a fresh document
    dev = next(loaded.model.parameters()).device
    x = torch.tensor([ids] * num_samples, dtype=torch.long, device=dev)
    g = torch.Generator(device=dev).manual_seed(seed)
    out = generate(loaded.model, x, max_new_tokens, temperature, top_k, g, stop_token=eos)
    # A document that ended is kept up to its end marker.
    return [tokenizer.decode(row[: row.index(eos)] if eos in row else row) for row in out[:, len(ids) :].tolist()]
