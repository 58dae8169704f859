"""transformers classes around mixit's own `Transformer`, for ``trust_remote_code`` (shipped with a ``--to hub``
export; docs/interop.md, "AutoModel, without mixit").

There is no second model here: each class holds a `mixit.models.Transformer` as ``model`` and adds what
transformers' conventions ask of a model class. `mixit.export` ships this file together with the mixit modules it
imports (the model, its config, their registry and errors), each import ``from mixit.PACKAGE.MODULE import``
rewritten ``from .MODULE import``, so the export loads with transformers and torch alone.

- ``MixitForCausalLM`` (language-model head): a ``GenerationMixin``, so ``generate()`` works; ``labels=`` gives
  the next-token loss (transformers' own ``ForCausalLM`` loss: shifted, ``-100`` ignored).
- ``MixitForSequenceClassification`` (classifier head): ``labels=`` gives the cross-entropy loss.

Both take ``attention_mask`` with right padding only (1 for a real token, then 0 for every pad; transformers'
tokenizers pad so when ``padding_side="right"``, the default of an exported tokenizer) and refuse any other mask.
Causal attention never lets a real position read a pad after it, softmax and MixiT alike (MixiT's fixed mixing
matrices are lower-triangular), so the mask changes no real position's output there; the outputs at the padded
positions are computed and mean nothing, as in any causal model. A model that reads padding (a classifier's
pooling, non-causal attention) is given the pad token (``pad_id``) at the masked positions, which it masks
itself. ``output_hidden_states=True`` returns n_layers + 1 tensors (B, T, d_model): the input to the first block
(embeddings, plus MixiT's learned positions) and each block's output, before the final norm.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput, SequenceClassifierOutput

from mixit.config import ModelConfig
from mixit.models.hooks import HookPoint
from mixit.models.transformer import Transformer
from mixit.remote_code.configuration_mixit import MixitConfig


class MixitPreTrainedModel(PreTrainedModel):
    """The transformers face of a mixit `Transformer` (``self.model``), whose state dict is the export's
    ``model.safetensors`` as `Transformer.save_pretrained` wrote it (transformers adds the ``model.`` prefix)."""

    config_class = MixitConfig
    base_model_prefix = "model"

    def __init__(self, config: MixitConfig):
        super().__init__(config)
        self.model = Transformer(ModelConfig.from_dict(config.cfg))
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Rebuild an attention layer's buffers that mixit derives from the config and does not save (softmax
        attention's RoPE tables): transformers builds the model on the meta device and leaves such buffers empty.
        The attention kind builds them again itself, in a layer made for the purpose. Every parameter and saved
        buffer is read from the export's weights, so nothing else is initialised."""
        saved = set(module.state_dict())
        derived = [name for name, _ in module.named_buffers(recurse=False) if name not in saved]
        if not derived:
            return
        layer = next((i for i, block in enumerate(self.model.layers) if block.attn is module), None)
        if layer is None:
            raise NotImplementedError(f"{type(module).__name__} has unsaved buffers ({derived}) this code cannot build")
        device = getattr(module, derived[0]).device
        with torch.random.fork_rng(devices=[]), torch.device(device):  # the layer's own init draws; the caller's kept
            fresh = type(module)(self.model.cfg, layer)
        for name in derived:
            getattr(module, name).copy_(getattr(fresh, name))

    def run(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, output_hidden_states: bool | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """The model's output on `input_ids` (B, T) read through `attention_mask`, and its hidden states if asked."""
        tokens = self.masked(input_ids, attention_mask)
        if not output_hidden_states:
            return self.model(tokens), None
        names = ["blocks.0.hook_resid_pre", *(f"blocks.{i}.hook_resid_post" for i in range(len(self.model.blocks)))]
        states: dict[str, torch.Tensor] = {}

        def keep(x: torch.Tensor, hook: HookPoint) -> None:
            states[hook.name] = x  # (B, T, d_model), not detached: gradients flow as through the outputs

        out = self.model.run_with_hooks(tokens, [(names, keep)])
        return out, tuple(states[name] for name in names)

    def masked(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """`input_ids` (B, T) as the model reads them under `attention_mask` (B, T): right padding only (see the
        module's docstring); the pad token at masked positions where the model has one."""
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
    """A mixit language model: ``logits`` (B, T, vocab_size); ``generate()`` recomputes the whole sequence at each
    step (mixit keeps no cache of keys and values), within the model's n_ctx."""

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> CausalLMOutput | tuple[Any, ...]:
        """Logits (B, T, vocab_size) and, with `labels` (B, T), the mean next-token loss over labels not -100."""
        logits, hidden = self.run(input_ids, attention_mask, output_hidden_states)
        loss = None if labels is None else self.loss_function(logits, labels, vocab_size=self.model.cfg.vocab_size)
        out = CausalLMOutput(loss=loss, logits=logits, hidden_states=hidden)
        return out if return_dict is not False else out.to_tuple()

    def prepare_inputs_for_generation(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """The whole sequence so far, at every step (no cache: `kwargs`, transformers' cache settings, are unused)."""
        return {"input_ids": input_ids, "attention_mask": attention_mask}


class MixitForSequenceClassification(MixitPreTrainedModel):
    """A mixit classifier: ``logits`` (B, n_classes)."""

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> SequenceClassifierOutput | tuple[Any, ...]:
        """Logits (B, n_classes) and, with `labels` (B,), the mean cross-entropy loss."""
        logits, hidden = self.run(input_ids, attention_mask, output_hidden_states)
        loss = None if labels is None else torch.nn.functional.cross_entropy(logits, labels)
        out = SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=hidden)
        return out if return_dict is not False else out.to_tuple()
