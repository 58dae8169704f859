"""Open registries: named, swappable parts chosen in one place.

An attention kind, an activation, a variant or a task is added by writing one
new module that registers it, plus the one line that imports that module
(docs/extending.md shows a worked example). Lookups of an unknown name raise
`UsageError` naming the allowed ones, so a typo in a config fails before any
work.
"""

from __future__ import annotations

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
        if name in self._items:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._items[name] = item

    def get(self, name: str) -> T:
        if name not in self._items:
            raise UsageError(f"unknown {self.what} {name!r}; allowed: {', '.join(self._items)}")
        return self._items[name]

    __getitem__ = get

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
