"""Bookkeeping of everything skewtrace replaced, so uninstrument restores exactly that."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("skewtrace")

MARKER = "_skewtrace_original"
"""Attribute on every function skewtrace installed, holding the function it replaced."""


class Patches:
    def __init__(self) -> None:
        self._attributes: list[tuple[object, str, Any]] = []
        self._undo: list[Callable[[], None]] = []

    def replace(self, owner: object, name: str, wrapper: Any, original: Any) -> None:
        setattr(wrapper, MARKER, original)
        setattr(owner, name, wrapper)
        self._attributes.append((owner, name, original))

    def on_restore(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def restore(self) -> None:
        # Reverse order: a function patched twice gets its first original back.
        for owner, name, original in reversed(self._attributes):
            try:
                setattr(owner, name, original)
            except Exception:
                logger.warning("skewtrace: could not restore %r.%s", owner, name, exc_info=True)
        self._attributes.clear()
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:
                logger.warning("skewtrace: undo step failed", exc_info=True)
        self._undo.clear()
