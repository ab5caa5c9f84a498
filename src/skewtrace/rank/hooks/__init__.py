"""Where skewtrace attaches to PyTorch: collectives, DDP buckets, module, optimizer, data,
checkpoints (``torch.save``/``torch.load``).

Each hook only reads clocks and appends an event (:mod:`skewtrace.rank._events`) to the
session's recorder (:mod:`skewtrace.rank._recorder`). Everything installed here is undone by
``Patches.restore()``.
"""

from __future__ import annotations

from skewtrace.rank.hooks._patches import MARKER, Patches

__all__ = ["MARKER", "Patches"]
