"""A mixit model for transformers' ``trust_remote_code`` (shipped with an export; imports no mixit).

The forward pass of ``mixit.models.Transformer`` (docs/model.md), written compactly with the same module
names, so the exported ``model.safetensors`` loads as it is:

    h = skip_scale * h + branch_scale * attn(norm1(h))
    h = skip_scale * h + branch_scale * mlp(norm2(h))
    logits = lm_head(norm_f(h))      (or classifier(pool(norm_f(h))))

Softmax attention applies RoPE (rotate-half) to q and k; MixiT attention multiplies v by its saved fixed
mixing matrices (``mixing``, causal only). mixit's tests check that this model's logits equal mixit's.
"""

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput, SequenceClassifierOutput

from .configuration_mixit import MixitConfig


class Linear(nn.Linear):
    """nn.Linear times a fixed multiplier (sqrt(base / fan_in) under width scaling, else 1)."""

    def __init__(self, fan_in: int, fan_out: int, bias: bool, cfg: dict[str, Any], base: int | None = None):
        super().__init__(fan_in, fan_out, bias=bias)
        base = cfg["base_width"] if base is None else base
        self.multiplier = math.sqrt(base / fan_in) if cfg["width_scaling"] else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return y if self.multiplier == 1.0 else y * self.multiplier


def rope(x: torch.Tensor, base: float) -> torch.Tensor:
    """x (B, H, T, d_head) rotated by position, rotate-half (mixit's `rope_tables`, in float64 then float)."""
    T, d_head = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # (d_head/2,)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)  # (T, d_head/2)
    angles = torch.cat([angles, angles], dim=-1).to(x.device)  # (T, d_head)
    cos, sin = angles.cos().float().to(x.dtype), angles.sin().float().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class SoftmaxAttention(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        d = cfg["d_model"]
        self.n_heads, self.causal, self.base = cfg["n_heads"], cfg["causal"], cfg["rope_base"]
        self.q, self.k, self.v, self.o = (Linear(d, d, cfg["bias"], cfg) for _ in range(4))

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = (
            p(x).view(B, T, self.n_heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v)
        )  # (B, H, T, d_head)
        mask = None if self.causal or valid is None else valid[:, None, None, :]  # (B, 1, 1, T)
        y = F.scaled_dot_product_attention(
            rope(q, self.base), rope(k, self.base), v, attn_mask=mask, is_causal=self.causal
        )
        return self.o(y.transpose(1, 2).reshape(B, T, D))


class MixingAttention(nn.Module):
    """MixiT: y_h = A_h V_h with the saved fixed random A_h (H, n_ctx, n_ctx); no queries or keys."""

    mixing: torch.Tensor  # (H, n_ctx, n_ctx) buffer

    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        if not cfg["causal"]:
            raise ValueError("this exported code runs causal MixiT only; load a non-causal one with mixit.load")
        d, H, n = cfg["d_model"], cfg["n_heads"], cfg["n_ctx"]
        self.n_heads = H
        self.v, self.o = Linear(d, d, cfg["bias"], cfg), Linear(d, d, cfg["bias"], cfg)
        self.register_buffer("mixing", torch.zeros(H, n, n))  # (H, n_ctx, n_ctx), read from the weights

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        B, T, D = x.shape
        v = self.v(x).view(B, T, self.n_heads, -1).transpose(1, 2)  # (B, H, T, d_head)
        y = self.mixing[:, :T, :T] @ v  # (B, H, T, d_head)
        return self.o(y.transpose(1, 2).reshape(B, T, D))


class GatedMLP(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        d, d_mlp = cfg["d_model"], cfg["d_mlp"]
        self.gate, self.up = Linear(d, d_mlp, cfg["bias"], cfg), Linear(d, d_mlp, cfg["bias"], cfg)
        self.down = Linear(d_mlp, d, cfg["bias"], cfg, base=cfg["down_base_width"])
        if cfg["activation"] == "silu":
            self.slope, self.gain = None, 1.0
        else:  # shaped_leaky_relu: slope 1 + c/sqrt(d_model), gain sqrt(2 / (1 + slope^2))
            self.slope = 1.0 + cfg["leaky_c"] / math.sqrt(d)
            self.gain = math.sqrt(2.0 / (1.0 + self.slope**2))

    def act(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x) if self.slope is None else F.leaky_relu(x, self.slope) * self.gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg["d_model"], eps=1e-6)
        self.attn = SoftmaxAttention(cfg) if cfg["attention"] == "softmax" else MixingAttention(cfg)
        self.norm2 = nn.RMSNorm(cfg["d_model"], eps=1e-6)
        self.mlp = GatedMLP(cfg)
        self.skip_scale, self.branch_scale = cfg["skip_scale"], cfg["branch_scale"]

    def residual(self, h: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        if self.skip_scale == 1.0 and self.branch_scale == 1.0:
            return h + branch
        return self.skip_scale * h + self.branch_scale * branch

    def forward(self, h: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        h = self.residual(h, self.attn(self.norm1(h), valid))
        return self.residual(h, self.mlp(self.norm2(h)))


class MixitModel(PreTrainedModel):
    """mixit's Transformer: ``model(input_ids).logits`` is (B, T, vocab_size), or (B, n_classes) for a
    classifier."""

    config_class = MixitConfig
    base_model_prefix = "mixit"

    def __init__(self, config: MixitConfig):
        super().__init__(config)
        cfg = self.cfg = config.cfg
        if cfg["attention"] not in ("softmax", "mixing"):
            raise ValueError(f"this exported code knows softmax and mixing attention, not {cfg['attention']!r}")
        d = cfg["d_model"]
        self.embed = nn.Embedding(cfg["vocab_size"], d)
        self.pos_embed = nn.Embedding(cfg["n_ctx"], d) if cfg["attention"] == "mixing" else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg["n_layers"]))
        self.norm_f = nn.RMSNorm(d, eps=1e-6)
        head_cfg = cfg if cfg["width_scale_head"] else {**cfg, "width_scaling": False}
        if cfg["head"] == "lm":
            self.lm_head = Linear(d, cfg["vocab_size"], False, head_cfg)
        else:
            self.classifier = Linear(d, cfg["n_classes"], False, head_cfg)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing: every tensor is read from the exported weights."""

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> CausalLMOutput | SequenceClassifierOutput:
        cfg = self.cfg
        T = input_ids.shape[1]  # input_ids (B, T)
        if T > cfg["n_ctx"]:
            raise ValueError(f"sequence length {T} exceeds the model's n_ctx={cfg['n_ctx']}")
        valid = None  # (B, T) bool: real tokens; read where padding could be
        if cfg["pad_id"] is not None and (cfg["head"] == "classifier" or not cfg["causal"]):
            valid = input_ids != cfg["pad_id"]
        h = self.embed(input_ids)  # (B, T, d_model)
        if self.pos_embed is not None:
            h = h + self.pos_embed.weight[:T]
        for block in self.blocks:
            h = block(h, valid)
        h = self.norm_f(h)
        if cfg["head"] == "lm":
            return CausalLMOutput(logits=self.lm_head(h))  # (B, T, vocab_size)
        return SequenceClassifierOutput(logits=self.classifier(self.pool(h, valid)))  # (B, n_classes)

    def pool(self, h: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """(B, T, d_model) -> (B, d_model): the last real token or the mean over real tokens."""
        if valid is None:
            return h[:, -1] if self.cfg["pooling"] == "last" else h.mean(dim=1)
        lengths = valid.sum(dim=1).clamp(min=1)  # (B,)
        if self.cfg["pooling"] == "last":
            return h[torch.arange(h.shape[0], device=h.device), lengths - 1]
        return (h * valid[..., None]).sum(dim=1) / lengths[:, None]
