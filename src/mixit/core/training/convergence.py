"""Has a run converged? The plateau criterion on the validation curve (docs/reproduction.md, "Convergence").

A run is judged by its task's selection metric on the validation set (`Task.selection`: token accuracy,
accuracy, or loss for language modelling), measured before training (step 0) and at every evaluation.
With the values signed so that higher is better, the run's state after its latest evaluation is

- ``solved``: an accuracy has reached `SOLVED` (nothing is left to learn);
- ``improving``: the best value of the last `patience` evaluations is at least `min_delta` above the
  best value before them;
- ``plateau``: it is not, and the curve did rise at least `min_delta` above where it started;
- ``flat``: it is not, and the curve never rose `min_delta` above its value at step 0;
- ``too_few``: there are not yet `patience` evaluations after step 0.

``solved``, ``plateau`` and ``flat`` count as converged at the end of a run. Early stopping
(``--early-stop``) stops at ``solved`` at once, at ``plateau`` only once half the step budget has been
trained, and never at ``flat``: a curve can sit at one level for a long time and then learn again
(MixiT on modular addition stays at chance for about a thousand steps; an 8-layer MixiT on 2-digit
addition sat at 50% from its 40th to its 200th step, where a window of four evaluations would have
stopped it), so an early plateau is no reason to stop. Curves that learn in steps (addition, a digit
at a time) can sit on a stair even in the second half: with ``--stop-at solved`` only a solved run
stops early (a MixiT of 16 heads on 3-digit addition stopped at step 900 of 1500 on a stair at 80%;
the same model on other held-out sets sat at 60% from step 450 to 750, at 80% at step 1050, and solved
the task at step 1425). At the end of the budget, a curve that never left its start is reported
as flat, which a report shows as such.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

SOLVED = 0.999
"""An accuracy at or above this is solved."""

CONVERGED = ("solved", "plateau", "flat")


@dataclass
class Convergence:
    """The validation curve of one run and the plateau criterion (module docstring)."""

    metric: str
    """The key of the validation metric (token_acc, accuracy or loss)."""
    higher_is_better: bool
    patience: int
    min_delta: float
    earliest: int = 0
    """A plateau stops a run no earlier than this step (half the step budget)."""
    stop_at: str = "plateau"
    """What stops a run early: "plateau" (a plateau from step `earliest` on, or solved) or "solved" only."""
    history: list[tuple[int, float]] = field(default_factory=list)
    """(step, value) of every evaluation, step 0 first."""

    def add(self, step: int, value: float) -> None:
        self.history = [(s, v) for s, v in self.history if s < step] + [(step, float(value))]

    def extend(self, events: Iterable[dict[str, Any]], up_to: int) -> None:
        """Take the validation values of metrics.jsonl eval events up to step `up_to` (a resumed run)."""
        key = f"val_{self.metric}"
        for event in events:
            if event.get("event") == "eval" and key in event and event["step"] <= up_to:
                self.add(event["step"], event[key])

    def _signed(self) -> list[float]:
        return [v if self.higher_is_better else -v for _, v in self.history]

    def gain(self) -> float:
        """How far the best of the last `patience` evaluations is above the best before them (metric units,
        positive = better); nan with too few evaluations."""
        signed = self._signed()
        if len(signed) <= self.patience:
            return float("nan")
        return max(signed[-self.patience :]) - max(signed[: -self.patience])

    @property
    def state(self) -> str:
        """solved, improving, plateau, flat or too_few (module docstring)."""
        signed = self._signed()
        if self.higher_is_better and signed and signed[-1] >= SOLVED:
            return "solved"
        if len(signed) <= self.patience:
            return "too_few"
        if self.gain() >= self.min_delta:
            return "improving"
        return "plateau" if max(signed) - signed[0] >= self.min_delta else "flat"

    @property
    def converged(self) -> bool:
        return self.state in CONVERGED

    @property
    def should_stop(self) -> bool:
        """Whether early stopping stops here: solved, or (unless `stop_at` is "solved") on a plateau from step
        `earliest` on."""
        state = self.state
        if state == "solved":
            return True
        return self.stop_at == "plateau" and state == "plateau" and self.history[-1][0] >= self.earliest

    def summary(self, stopped_early: bool, steps_trained: int) -> dict[str, Any]:
        """What summary.json records of the curve."""
        if not self.history:
            return {"metric": self.metric, "higher_is_better": self.higher_is_better, "converged": False}
        signed = self._signed()
        best = max(range(len(signed)), key=lambda i: signed[i])
        window = self.history[-self.patience :] if len(self.history) > self.patience else self.history
        gain = self.gain()
        return {
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "converged": self.converged,
            "reason": self.state,
            "best": self.history[best][1],
            "best_step": self.history[best][0],
            "last": self.history[-1][1],
            "gain": None if gain != gain else round(gain, 6),
            "window": [window[0][0], window[-1][0]],
            "patience": self.patience,
            "min_delta": self.min_delta,
            "stopped_early": stopped_early,
            "steps_trained": steps_trained,
        }


@dataclass
class Selection:
    """The evaluation a run would be stopped at: the one whose validation selection metric is best (the
    metric of `Convergence`, signed by `higher_is_better`; the earliest of equals; nan counts as worst),
    with its test and validation metrics. The test number there is what the protocol reports
    (docs/reproduction.md, "Protocol"): the model chosen on validation, not the last one trained.
    """

    metric: str
    higher_is_better: bool
    step: int | None = None
    test: dict[str, float] = field(default_factory=dict)
    val: dict[str, float] = field(default_factory=dict)

    def _signed(self, val: dict[str, float]) -> float:
        value = float(val[self.metric])
        return -math.inf if math.isnan(value) else (value if self.higher_is_better else -value)

    def add(self, step: int, test: dict[str, float], val: dict[str, float]) -> None:
        """Keep the evaluation at `step` if its validation metric beats the best so far (evaluations come in
        step order, so an equal one is later and is not kept)."""
        if self.step is None or self._signed(val) > self._signed(self.val):
            self.step, self.test, self.val = step, dict(test), dict(val)

    def extend(self, events: Iterable[dict[str, Any]], up_to: int) -> None:
        """Take the metrics.jsonl eval events up to step `up_to` (a resumed run): the test metrics under their
        names, the validation metrics as ``val_<name>``."""
        for event in events:
            if event.get("event") != "eval" or event["step"] > up_to or f"val_{self.metric}" not in event:
                continue
            metrics = {k: v for k, v in event.items() if k not in ("step", "event")}
            test = {k: v for k, v in metrics.items() if not k.startswith("val_")}
            val = {k.removeprefix("val_"): v for k, v in metrics.items() if k.startswith("val_")}
            self.add(event["step"], test, val)

    def summary(self) -> dict[str, Any]:
        """What summary.json records as ``selected``: the step and its test and validation metrics."""
        return {"step": self.step, "test": self.test, "val": self.val}
