"""mixit: which trainable parts of a transformer do which jobs.

A research framework around "Attention Retrieves, MLP Memorizes" (Dong, Noci,
Khodak, Li; arXiv 2506.01115): one small decoder trained under different
freezing regimes (standard, frozen Q/K, frozen MLP, MixiT, random) on
algorithmic tasks.

    from mixit import run_config, train
    summary = train(run_config("addition", "mixit", {"n_digits": 5}, steps=500), "runs/demo")
"""

__version__ = "0.1.0"

from mixit.config import ModelConfig, RunConfig, TrainConfig  # noqa: E402
from mixit.errors import UsageError  # noqa: E402
from mixit.freezing import VARIANTS, FreezeReport, apply_variant  # noqa: E402
from mixit.models import Transformer, capture_patterns  # noqa: E402
from mixit.train.loop import build, run_config, train  # noqa: E402

__all__ = ["VARIANTS", "FreezeReport", "ModelConfig", "RunConfig", "TrainConfig", "Transformer", "UsageError",
           "apply_variant", "build", "capture_patterns", "run_config", "train", "__version__"]
