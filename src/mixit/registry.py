"""Open registries: named, swappable parts chosen in one place.

An attention kind, an activation, a variant or a task is added by writing one
new module that registers it, plus the one line that imports that module
(docs/extending.md shows a worked example). Lookups of an unknown name raise
`UsageError` naming the allowed ones, so a typo in a config fails before any
work.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from mixit.errors import UsageError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> object table that refuses duplicates and unknown names.

    ATTENTION = Registry[type[nn.Module]]("attention kind")

    @ATTENTION.register("softmax")
    class SoftmaxAttention(nn.Module): ...

    ATTENTION.get("softmax")      # the class; UsageError for an unknown name
    """

    def __init__(self, what: str):
        self.what = what
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the decorated object under `name`."""

        def add(item: T) -> T:
            self.add(name, item)
            return item

        return add

    def add(self, name: str, item: T) -> None:
        """Register `item` under `name`. A name taken by something else is refused; the same definition again
        (an equal object, or a class or function of the same module and qualified name: a notebook cell run
        twice) replaces it."""
        if name in self._items and not same_definition(self._items[name], item):
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._items[name] = item

    def get(self, name: str) -> T:
        if name not in self._items:
            raise UsageError(
                f"unknown {self.what} {name!r}; allowed: {', '.join(self._items)} (one of your own: name its module "
                "in MIXIT_PLUGINS, docs/extending.md)"
            )
        return self._items[name]

    __getitem__ = get

    @contextlib.contextmanager
    def lent(self, name: str, item: T) -> Iterator[None]:
        """Within: `item` registered under `name`, a name nothing holds, and removed again on leaving. For reading
        back what a definition this process lacks made, from what was recorded of it (an export of a plugin's
        variant: `mixit.export.load`), without keeping a stand-in that the real definition would then clash with."""
        if name in self._items:
            raise ValueError(f"{self.what} {name!r} is registered; it cannot be lent")
        self._items[name] = item
        try:
            yield
        finally:
            del self._items[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[tuple[str, T]]:
        return list(self._items.items())

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)


def same_definition(old: object, new: object) -> bool:
    """Whether `new` is `old` defined again: equal, or a class or function with the same module and qualified name."""
    if old == new:
        return True
    name = getattr(old, "__qualname__", None)
    return name is not None and (old.__module__, name) == (
        getattr(new, "__module__", None),
        getattr(new, "__qualname__", None),
    )
