"""What can be chosen (`mixit list`), read from the registries and the config classes so that it cannot drift from
the code."""

from __future__ import annotations

import json as jsonlib
from typing import Any

from mixit.core.config import field_docs, field_hints
from mixit.core.freezing import VARIANTS
from mixit.core.models.attention import ATTENTION
from mixit.core.models.mlp import ACTIVATIONS
from mixit.core.recipes import RECIPES
from mixit.core.tasks import TASKS


def catalogue() -> dict[str, Any]:
    """Every registered choice, as a JSON-serialisable dict."""
    tasks = {}
    for name, cls in TASKS.items():
        hints, docs = field_hints(cls.Config), field_docs(cls.Config)
        types = {k: getattr(hint, "__name__", str(hint).replace("typing.", "")) for k, hint in hints.items()}
        tasks[name] = {
            "description": cls.description(),
            "parameters": {
                key: {"default": value, "type": types[key], "doc": docs.get(key, "")}
                for key, value in cls.Config().to_dict().items()
            },
            "defaults": dict(cls.Config.run_defaults),
        }
    variants = {
        name: {"attention": v.attention, "description": v.description, "freezes": list(v.freeze)}
        for name, v in VARIANTS.items()
    }
    recipes = {
        name: {
            "description": r.description,
            "tasks": {task: r.settings(task, "softmax") for task in TASKS},
            "with_mixing": {task: r.settings(task, "mixing") for task in TASKS},
        }
        for name, r in RECIPES.items()
    }
    return {
        "tasks": tasks,
        "variants": variants,
        "attention_kinds": {name: dict(cls.coupled) for name, cls in ATTENTION.items()},
        "activations": list(ACTIVATIONS.names()),
        "recipes": recipes,
    }


def catalogue_text(json: bool = False) -> str:
    """List the tasks with their parameters and defaults, the variants, attention kinds, recipes and activations.

    Args:
        json: Print machine-readable JSON instead of text.
    """
    listing = catalogue()
    if json:
        return jsonlib.dumps(listing, indent=2)
    lines = ["tasks (--task NAME; parameters with -p KEY=VALUE; own defaults of other options in brackets):"]
    for name, info in listing["tasks"].items():
        params = ", ".join(f"{k}={p['default']!r}" for k, p in info["parameters"].items())
        own = ", ".join(f"{k}={v}" for k, v in info["defaults"].items())
        lines += [f"  {name:<17} {info['description']}", f"  {'':<17} parameters: {params}", f"  {'':<17} [{own}]"]
    lines.append("variants (--variant NAME), with what each freezes (--freeze SELECTORS adds to it):")
    for name, info in listing["variants"].items():
        freezes = ", ".join(info["freezes"]) or "nothing"
        lines.append(f"  {name:<17} [{info['attention']}] {info['description']}; freezes {freezes}")
    lines.append(
        "attention kinds (--attention: with the variant naming it, with random, or, marked *, with any variant), "
        "with the options each brings unless set:"
    )
    for name, coupled in listing["attention_kinds"].items():
        settings = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in coupled.items())
        mark = "*" if ATTENTION.get(name).any_variant else " "
        lines.append(f"{mark} {name:<17} {settings or '-'}")
    lines.append("recipes (--recipe NAME; where unset options start from):")
    for name, info in listing["recipes"].items():
        lines.append(f"  {name:<17} {info['description']}")
        for task, settings in info["tasks"].items():
            if settings:
                text = ", ".join(f"{k}={v}" for k, v in settings.items())
                lines.append(f"  {'':<17} {task}: {text}")
    lines.append(f"activations (--activation): {', '.join(listing['activations'])}")
    return "\n".join(lines)
