"""mixit: which trainable parts of a transformer do which jobs.

A research framework around "Attention Retrieves, MLP Memorizes" (Dong, Noci,
Khodak, Li; arXiv 2506.01115): one small decoder trained under different
freezing regimes (standard, frozen Q/K, frozen MLP, MixiT, random) on
algorithmic tasks, language modelling and sentiment classification.

    from mixit import load, run_config, train
    summary = train(run_config("addition", "mixit", {"n_digits": 5}, steps=500), "runs/demo")
    loaded = load("runs/demo")  # or an exported directory, or its Hub repo id
"""

from mixit.core.config import ModelConfig, TaskConfig, TrainConfig
from mixit.core.experiment import RunConfig, build, resolve, run_config
from mixit.core.freezing import VARIANTS, FreezeReport, apply_variant
from mixit.core.models import Transformer, capture_patterns
from mixit.core.run import Run
from mixit.core.tasks import TASKS, make_task
from mixit.core.training.loop import train
from mixit.errors import MachineFault, UsageError
from mixit.export import load
from mixit.plugins import load_plugins
from mixit.version import __version__

__all__ = [
    "TASKS",
    "VARIANTS",
    "FreezeReport",
    "MachineFault",
    "ModelConfig",
    "Run",
    "RunConfig",
    "TaskConfig",
    "TrainConfig",
    "Transformer",
    "UsageError",
    "__version__",
    "apply_variant",
    "build",
    "capture_patterns",
    "load",
    "load_plugins",
    "make_task",
    "resolve",
    "run_config",
    "train",
]
