"""Text sampling from a trained language model (`mixit sample RUN_DIR`)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from mixit.errors import UsageError


@torch.no_grad()
def generate(model: nn.Module, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, generator: torch.Generator | None = None,
             stop_token: int | None = None) -> torch.Tensor:
    """Extend `prompt` (B, T0) ids by up to `max_new_tokens` sampled tokens -> (B, T0 + n).

    The model reads at most its last n_ctx tokens (a sliding window; no key-value cache,
    which keeps every attention kind, MixiT included, on one code path). temperature 0
    takes the most likely token; top_k keeps only the k most likely before sampling.
    Generation stops early once every row has produced `stop_token`.
    """
    if temperature < 0:
        raise UsageError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise UsageError(f"top_k must be a positive integer, got {top_k}")
    was_training = model.training
    model.eval()
    n_ctx = model.cfg.n_ctx
    out = prompt
    done = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    for _ in range(max_new_tokens):
        logits = model(out[:, -n_ctx:])[:, -1].float()  # (B, vocab)
        if temperature == 0:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None and top_k < logits.shape[-1]:
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


def sample_run(run_dir: str | Path, prompt: str, max_new_tokens: int = 200, temperature: float = 0.8,
               top_k: int | None = 50, num_samples: int = 1, seed: int = 0, device: str = "auto") -> list[str]:
    """Continuations of `prompt` from the latest checkpoint of a language-model run,
    each ending where the model ends its document (EOS) or after max_new_tokens."""
    from mixit.analysis.report import load_run

    if max_new_tokens < 1 or num_samples < 1:
        raise UsageError(f"max_new_tokens and num_samples must be positive, got {max_new_tokens}, {num_samples}")
    cfg, task, model, _ = load_run(Path(run_dir), device)
    tokenizer = getattr(task, "tokenizer", None)
    if tokenizer is None or cfg.model.head != "lm":
        raise UsageError(f"{run_dir} is a {cfg.task} run; sampling needs a language-model run (--task lm)")
    dev = next(model.parameters()).device
    ids = tokenizer.encode(prompt) if prompt else []
    if not ids:
        ids = [tokenizer.eos_id]  # an empty prompt starts a fresh document
    x = torch.tensor([ids] * num_samples, dtype=torch.long, device=dev)
    g = torch.Generator(device=dev).manual_seed(seed)
    out = generate(model, x, max_new_tokens, temperature, top_k, g, stop_token=tokenizer.eos_id)
    texts = []
    for row in out[:, len(ids):].tolist():
        if tokenizer.eos_id in row:  # the document ended: keep the text up to its end marker
            row = row[:row.index(tokenizer.eos_id)]
        texts.append(tokenizer.decode(row))
    return texts
