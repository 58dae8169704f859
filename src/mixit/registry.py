"""Open registries: named, swappable parts (attention kinds, activations, variants, tasks, recipes) chosen in one
place; a module of one's own adds one (docs/extending.md). An unknown name is refused naming the allowed ones."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from mixit.errors import UsageError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> object table that refuses duplicates and unknown names: ``@ATTENTION.register("softmax")`` on a
    class, ``ATTENTION.get("softmax")`` (or ``ATTENTION["softmax"]``) for it."""

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
        """Within: `item` registered under `name`, a name nothing holds. For reading back what a definition this
        process lacks made (an export of a plugin's variant: `mixit.export.load`), without keeping a stand-in that the
        real definition would then clash with."""
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

    def where(obj: object) -> tuple[object, object]:
        return getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)

    return old == new or (hasattr(old, "__qualname__") and where(old) == where(new))
