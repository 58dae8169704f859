"""The transformers config of an exported mixit model (shipped with it, as `mixit.remote_code.modeling_mixit`)."""

from typing import Any

from transformers import PretrainedConfig


class MixitConfig(PretrainedConfig):
    """``cfg``: the mixit ``ModelConfig`` as a mapping; the rest is transformers' own (token ids, ``auto_map``)."""

    model_type = "mixit"

    def __init__(self, cfg: dict[str, Any] | None = None, **kwargs: Any):
        self.cfg = dict(cfg or {})
        super().__init__(**kwargs)
