"""The decoder of docs/model.md: pre-norm blocks, gated MLP, untied head.

    h = skip_scale * h + branch_scale * attn(norm1(h))
    h = skip_scale * h + branch_scale * mlp(norm2(h))
    logits = lm_head(norm_f(h))

The attention kind comes from `ATTENTION.get(cfg.attention)`, the one place it
is chosen; a kind without Q and K (MixiT) declares ``learned_positions`` and
the model adds learned absolute position embeddings for it. What is trained
is decided afterwards, by `mixit.core.freezing.apply_variant`, never inside the
model.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from mixit.core.config import ModelConfig
from mixit.core.models.attention import ATTENTION, Attention
from mixit.core.models.hooks import HookFn, HookPoint, NamesFilter, attach, capture, name_hook_points
from mixit.core.models.layers import Linear, scaled_linear
from mixit.core.models.mlp import GatedMLP
from mixit.errors import UsageError


class Block(nn.Module):
    """One pre-norm block: attention, then the MLP, each on a scaled residual.

    The residual stream and each branch's output pass through hook points named as in
    TransformerLens: hook_resid_pre, hook_attn_out, hook_resid_mid, hook_mlp_out, hook_resid_post
    (the branch outputs before branch_scale).
    """

    attn: Attention

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        # Modules in the order the forward pass meets them, so a cache lists its hook points in that order.
        self.hook_resid_pre = HookPoint()
        self.norm1 = nn.RMSNorm(cfg.d_model, eps=1e-6)
        self.attn = ATTENTION.get(cfg.attention)(cfg, layer)
        self.hook_attn_out, self.hook_resid_mid = HookPoint(), HookPoint()
        self.norm2 = nn.RMSNorm(cfg.d_model, eps=1e-6)
        self.mlp = GatedMLP(cfg)
        self.hook_mlp_out, self.hook_resid_post = HookPoint(), HookPoint()
        self.skip_scale, self.branch_scale = cfg.skip_scale, cfg.branch_scale

    def forward(self, h: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """h (B, T, d_model); valid (B, T) bool: the unpadded positions (non-causal attention only)."""
        h = self.hook_resid_pre(h)
        h = self.hook_resid_mid(self.residual(h, self.hook_attn_out(self.attn(self.norm1(h), valid))))
        return self.hook_resid_post(self.residual(h, self.hook_mlp_out(self.mlp(self.norm2(h)))))

    def residual(self, h: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        """skip_scale * h + branch_scale * branch (B, T, d_model); at the usual scales of 1 a plain sum, without
        full-size multiplies by 1."""
        if self.skip_scale == 1.0 and self.branch_scale == 1.0:
            return h + branch
        return self.skip_scale * h + self.branch_scale * branch


class Blocks(nn.ModuleList):
    """The model's blocks, in order: a ModuleList whose iteration says what it holds."""

    def __iter__(self) -> Iterator[Block]:
        return typing.cast(Iterator[Block], super().__iter__())


class Transformer(nn.Module, PyTorchModelHubMixin, library_name="mixit", tags=["mixit"]):
    """The decoder. huggingface_hub's mixin gives it ``save_pretrained(DIR)``, ``push_to_hub`` and
    ``Transformer.from_pretrained(DIR or repo id)``: ``cfg`` as JSON, the state as safetensors
    (docs/interop.md). It sits on this class, not a subclass, so that any model (a run's, one built
    by hand) can be saved as it is and loads back as the class everything else builds."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # torch's layers draw a throw-away initialisation from the global generator;
        # building inside a fork leaves the caller's random state untouched.
        with torch.random.fork_rng(devices=[]):
            self._build(cfg)
        self.reset_parameters()
        name_hook_points(self)

    def _build(self, cfg: ModelConfig) -> None:
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        learned_positions = ATTENTION.get(cfg.attention).learned_positions
        self.pos_embed = nn.Embedding(cfg.n_ctx, cfg.d_model) if learned_positions else None
        # Hook points outside the blocks (docs/model.md, "Hook points").
        self.hook_embed = HookPoint()
        self.hook_pos_embed = HookPoint() if learned_positions else None
        self.blocks = Blocks(Block(cfg, layer) for layer in range(cfg.n_layers))
        self.norm_f = nn.RMSNorm(cfg.d_model, eps=1e-6)
        # The final norm's normalized stream, before its gain (`final_norm`), named as TransformerLens names it;
        # the holder has no parameters, so the saved state is unchanged.
        self.ln_final = nn.ModuleDict({"hook_normalized": HookPoint()})
        # The head is width-scaled like the block linears when the config says so (the reference's ScaledLinear).
        head_cfg = cfg if cfg.width_scale_head else dataclasses.replace(cfg, width_scaling=False)
        out = cfg.vocab_size if cfg.head == "lm" else cfg.n_classes
        head = scaled_linear(head_cfg, cfg.d_model, out, base=cfg.base_width, bias=False)
        if cfg.head == "lm":
            self.lm_head = head
        else:
            self.classifier = head
        # Right-padding inputs to n_ctx, for an attention kind that reads a fixed length (the reference's
        # non-causal MixiT centring).
        self.pads_to_n_ctx = any(block.attn.fixed_length for block in self.blocks)

    def init_std(self, module: Linear) -> float:
        """The std of `module`'s weight at initialisation (docs/model.md, "Initialisation"):
        init_std, except queries and keys under qk_init=paper (effective std 1/sqrt(d_model)) and the
        block linears under width_init=fan_in (effective std 1/sqrt(fan_in)). "Effective" is the std of
        weight times the layer's width multiplier."""
        cfg = self.cfg
        queries_keys = [getattr(b.attn, name) for b in self.blocks for name in ("q", "k") if hasattr(b.attn, name)]
        if cfg.qk_init == "paper" and any(module is m for m in queries_keys):
            return 1.0 / (math.sqrt(cfg.d_model) * module.multiplier)
        is_head = module is getattr(self, "lm_head", None) or module is getattr(self, "classifier", None)
        if cfg.width_scaling and cfg.width_init == "fan_in" and not is_head:
            return 1.0 / (math.sqrt(module.in_features) * module.multiplier)
        return cfg.init_std

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise from cfg.seed: weights and embeddings normal (`init_std`), zero
        biases, unit norm gains. Buffers are left alone: they are built from their
        own seeds at construction.
        """
        g = torch.Generator().manual_seed(self.cfg.seed)
        for module in self.modules():
            if isinstance(module, nn.RMSNorm):
                module.weight.fill_(1.0)
            elif isinstance(module, Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=g) * self.init_std(module))
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                module.weight.copy_(torch.randn(module.weight.shape, generator=g) * self.cfg.init_std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) int64 with T <= n_ctx -> logits (B, T, vocab_size),
        or (B, n_classes) with the classifier head.

        Inputs are right-padded with cfg.pad_id, if any. Causal attention never
        lets a real position read a pad (pads come after it); non-causal
        attention masks them out, and pooling skips them, so a padded and an
        unpadded copy of an input get the same classification.
        """
        cfg = self.cfg
        T = tokens.shape[1]  # tokens (B, T)
        if T > cfg.n_ctx:
            raise ValueError(f"sequence length {T} exceeds the model's n_ctx={cfg.n_ctx}")
        if self.pads_to_n_ctx and cfg.pad_id is not None and T < cfg.n_ctx:
            tokens = F.pad(tokens, (0, cfg.n_ctx - T), value=cfg.pad_id)  # (B, n_ctx)
            T = cfg.n_ctx
        valid = None  # (B, T) bool: real tokens; needed only where padding could be read
        if cfg.pad_id is not None and (cfg.head == "classifier" or not cfg.causal):
            valid = tokens != cfg.pad_id
        h = self.hook_embed(self.embed(tokens))  # (B, T, d_model)
        if self.pos_embed is not None and self.hook_pos_embed is not None:
            h = h + self.hook_pos_embed(self.pos_embed.weight[:T].expand(tokens.shape[0], -1, -1))
        for block in self.blocks:
            h = block(h, valid)
        h = self.final_norm(h)
        if cfg.head == "lm":
            return self.lm_head(h)  # (B, T, vocab_size)
        return self.classifier(self.pool(h, valid))  # (B, n_classes)

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        """norm_f(h) (B, T, d_model), passing the stream normalized, before norm_f's gain, through
        ``ln_final.hook_normalized``.

        That is TransformerLens's meaning of the name (its RMSNorm hooks x / rms(x) and multiplies by the gain
        afterwards; with ``fold_ln`` the gain moves into the unembedding), so the bridge's hook holds the same
        tensor on a trained model, whose gains are not 1, and a replacement is normalized, the gain still
        applied. Unwatched, norm_f runs as one module; watched, as normalisation then gain, the same product
        (bit for bit where torch's RMSNorm multiplies by the gain last, as its CPU kernel does).
        """
        hook = self.ln_final["hook_normalized"]
        if not typing.cast(HookPoint, hook).active:
            return self.norm_f(h)
        normalized = F.rms_norm(h, self.norm_f.normalized_shape, None, self.norm_f.eps)  # (B, T, d_model)
        return hook(normalized) * self.norm_f.weight

    def pool(self, h: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """(B, T, d_model) -> (B, d_model): the last real token, or the mean over real tokens (cfg.pooling).
        Padding is on the right, so the last real token sits at length - 1."""
        if valid is None:
            return h[:, -1] if self.cfg.pooling == "last" else h.mean(dim=1)
        lengths = valid.sum(dim=1).clamp(min=1)  # (B,)
        if self.cfg.pooling == "last":
            return h[torch.arange(h.shape[0], device=h.device), lengths - 1]
        return (h * valid[..., None]).sum(dim=1) / lengths[:, None]

    def run_with_cache(
        self, tokens: torch.Tensor, names_filter: NamesFilter = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The forward pass, and the activations at the hook points `names_filter` selects (None: all; a name,
        a list of names or a predicate on the name): (output, {hook point name: tensor, detached}).

        Gradients flow to the output as in ``model(tokens)``. Selecting ``attn.hook_pattern`` makes softmax
        attention compute its pattern explicitly (same logits up to rounding); the other hook points leave
        the computation as it is.
        """
        with capture(self, names_filter) as cache:
            out = self(tokens)
        return out, cache

    def run_with_hooks(self, tokens: torch.Tensor, fwd_hooks: Sequence[tuple[NamesFilter, HookFn]]) -> torch.Tensor:
        """The forward pass with ``fn(activation, hook)`` run at the hook points each ``(names, fn)`` of
        `fwd_hooks` selects; a tensor returned by ``fn`` replaces the activation (`mixit.core.models.hooks.attach`).
        The hooks are removed afterwards."""
        with attach(self, fwd_hooks):
            return self(tokens)

    def num_params(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    @classmethod
    def _from_pretrained(
        cls, *, model_id: str, config: dict[str, Any] | None = None, strict: bool = True, **kwargs: Any
    ) -> Transformer:
        """The mixin's loader, with the saved config validated as every ModelConfig is (unknown keys
        refused) and every tensor required (`strict`); the Hub's arguments pass through `kwargs`.

        A directory whose config.json holds no mixit model config (``cfg``), such as a ``mixit export --to hf``
        Llama, is refused in one line saying what reads it."""
        cfg = kwargs.pop("cfg", None)
        if cfg is None:
            exported = (config or {}).get("mixit_export", {}).get("format")
            reader = "mixit.load() or transformers' AutoModelForCausalLM" if exported == "hf" else "its own library"
            what = "a `mixit export --to hf` Llama" if exported == "hf" else "not a mixit model"
            raise UsageError(f"{model_id} is {what} (its config.json has no `cfg`): read it with {reader}")
        cfg = cfg if isinstance(cfg, ModelConfig) else ModelConfig.from_dict(cfg)
        return super()._from_pretrained(model_id=model_id, cfg=cfg, strict=strict, **kwargs)
