"""The engine's waiting queue: queue order plus O(1) removal of any request.

Requests join at the tail when they arrive and at the head when they are preempted or cleared
(vLLM's rule: a victim is served before later arrivals). A policy may admit any waiting request,
not only the head (SJF, MC-SF, LPM, VTC pick by their own keys), so the engine must take any
request out of the queue cheaply: with a plain list that is a linear search per admission, which
made long overloaded runs quadratic.

The queue is two insertion-ordered dicts (Python dicts keep insertion order and delete any key
in O(1)): ``_back`` holds the arrivals in arrival order, ``_front`` the requests pushed back to
the head, most recent push last, so the queue reads ``reversed(_front)`` then ``_back``.
Policies see it as a read-only sequence (iteration, ``len``, ``in``, indexing and slicing, and
NumPy conversion); indexing past the head builds a list once per change of the queue.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain, islice
from typing import Any

import numpy as np


class WaitingQueue:
    """Waiting request ids in queue order (see the module docstring).

    Read like a list: ``for rid in q``, ``len(q)``, ``rid in q``, ``q[0]``, ``q[:k]``,
    ``list(q)``, ``np.asarray(q)``; ``q == [1, 2]`` compares the order. Only the engine mutates it.
    """

    __slots__ = ("_front", "_back", "_list")

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self._front: dict[int, None] = {}
        self._back: dict[int, None] = dict.fromkeys(ids)
        self._list: list[int] | None = None

    # ---- reading ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._front) + len(self._back)

    def __bool__(self) -> bool:
        return bool(self._back) or bool(self._front)

    def __iter__(self) -> Iterator[int]:
        if self._front:
            return chain(reversed(self._front), self._back)
        return iter(self._back)

    def __contains__(self, rid: object) -> bool:
        return rid in self._back or rid in self._front

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            if not i.start and i.step is None and i.stop is not None and i.stop >= 0:
                return list(islice(self, i.stop))
            return self.as_list()[i]
        if i == 0 and self:
            return next(iter(self))
        return self.as_list()[i]

    def as_list(self) -> list[int]:
        """The queue as a list (built once per change; do not mutate it)."""
        if self._list is None:
            self._list = list(self)
        return self._list

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.fromiter(self, dtype=dtype or np.int64, count=len(self))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, WaitingQueue | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"WaitingQueue({list(self)!r})"

    # ---- the engine's mutations ---------------------------------------------------------
    def append(self, rid: int) -> None:
        """``rid`` joins at the tail."""
        self._back[rid] = None
        self._list = None

    def extend(self, ids: Iterable[int]) -> None:
        """``ids`` join at the tail, in order."""
        self._back.update(dict.fromkeys(ids))
        self._list = None

    def push_front(self, ids: list[int]) -> None:
        """``ids`` go to the head, in the given order (``ids[0]`` becomes the head)."""
        front = self._front
        for rid in reversed(ids):
            front[rid] = None
        self._list = None

    def remove(self, rid: int) -> None:
        """Take ``rid`` out (KeyError if it is not waiting)."""
        try:
            del self._back[rid]
        except KeyError:
            del self._front[rid]
        self._list = None
