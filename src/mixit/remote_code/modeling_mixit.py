"""transformers classes around mixit's own `Transformer`, for ``trust_remote_code`` (docs/interop.md, "AutoModel,
without mixit"). `mixit.export` ships this file with the mixit modules it imports, those imports made relative.

``attention_mask`` is read as right padding only, as an exported tokenizer pads. Causal attention, softmax or MixiT,
never lets a real position read a pad after it, so the mask changes no real position's output; a model that reads
padding (a classifier's pooling, non-causal attention) is given its pad token at the masked positions instead.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput, ModelOutput, SequenceClassifierOutput

from mixit.core.config import ModelConfig
from mixit.core.models.hooks import HookPoint
from mixit.core.models.transformer import Transformer
from mixit.remote_code.configuration_mixit import MixitConfig


class MixitPreTrainedModel(PreTrainedModel):
    """A mixit `Transformer` as ``self.model`` (transformers adds the ``model.`` prefix to the export's weights)."""

    config_class = MixitConfig
    base_model_prefix = "model"
    output_class: type[ModelOutput]

    def __init__(self, config: MixitConfig):
        super().__init__(config)
        self.model = Transformer(ModelConfig.from_dict(config.cfg))
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Rebuild the buffers an attention layer derives and does not save (softmax's RoPE tables), which
        transformers leaves empty, building the model on the meta device, from a fresh copy of the layer."""
        saved = set(module.state_dict())
        derived = [name for name, _ in module.named_buffers(recurse=False) if name not in saved]
        if not derived:
            return
        layer = next(i for i, block in enumerate(self.model.blocks) if block.attn is module)
        with torch.random.fork_rng(devices=[]), torch.device(getattr(module, derived[0]).device):
            fresh = type(module)(self.model.cfg, layer)  # its own init draws: the caller's random state is kept
        for name in derived:
            getattr(module, name).copy_(getattr(fresh, name))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> ModelOutput | tuple[Any, ...]:
        """Logits, (B, T, vocab_size) or (B, n_classes), of `input_ids` (B, T) read through `attention_mask`;
        with `labels`, the mean loss; with `output_hidden_states`, n_layers + 1 tensors (B, T, d_model)."""
        tokens = self.masked(input_ids, attention_mask)
        names = ["blocks.0.hook_resid_pre", *(f"blocks.{i}.hook_resid_post" for i in range(len(self.model.blocks)))]
        states: dict[str, torch.Tensor] = {}

        def keep(x: torch.Tensor, hook: HookPoint) -> None:
            states[hook.name] = x  # not detached: gradients flow as through the logits

        logits = self.model.run_with_hooks(tokens, [(names, keep)] if output_hidden_states else [])
        out = self.output_class(
            loss=None if labels is None else self.loss(logits, labels),
            logits=logits,
            hidden_states=tuple(states[name] for name in names) if output_hidden_states else None,
        )
        return out if return_dict is not False else out.to_tuple()

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The mean loss of `logits` against `labels`."""
        raise NotImplementedError

    def masked(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """`input_ids` (B, T) as the model reads them under `attention_mask` (B, T) (the module's docstring)."""
        if attention_mask is None or bool(attention_mask.all()):
            return input_ids
        mask = attention_mask.bool()  # (B, T)
        if attention_mask.shape != input_ids.shape or bool((mask[:, 1:] > mask[:, :-1]).any()):
            raise ValueError(
                "attention_mask must be right padding of input_ids' shape (1 for each real token, then 0 for each "
                "pad): mixit models read right-padded input only; pad with tokenizer.padding_side = 'right'"
            )
        cfg = self.model.cfg
        if cfg.pad_id is not None:
            return input_ids.masked_fill(~mask, cfg.pad_id)
        if cfg.causal and cfg.head == "lm":
            return input_ids
        raise ValueError("this model has no pad token (pad_id is null), so it cannot read padded input")


class MixitForCausalLM(MixitPreTrainedModel, GenerationMixin):
    """A mixit language model; ``generate()`` recomputes the whole sequence at each step (mixit keeps no cache)."""

    output_class = CausalLMOutput

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """transformers' own next-token loss: shifted, labels -100 ignored."""
        return self.loss_function(logits, labels, vocab_size=self.model.cfg.vocab_size)

    def prepare_inputs_for_generation(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """The whole sequence so far, at every step (`kwargs`, transformers' cache settings, are unused)."""
        return {"input_ids": input_ids, "attention_mask": attention_mask}


class MixitForSequenceClassification(MixitPreTrainedModel):
    """A mixit classifier."""

    output_class = SequenceClassifierOutput

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The cross-entropy of `logits` (B, n_classes) against class `labels` (B,)."""
        return torch.nn.functional.cross_entropy(logits, labels)
