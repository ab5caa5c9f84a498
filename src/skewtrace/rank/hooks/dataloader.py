"""``dataloader.fetch`` spans: how long the rank waited for each batch.

The loader is instrumented in place so the training loop keeps using the object it has:
its class is swapped for a subclass whose ``__iter__`` returns a timing iterator
(``isinstance`` checks still hold); uninstrument swaps the original class back. Objects
whose class cannot be swapped (builtins such as ``list``) are rejected with a TypeError that
points at :func:`skewtrace.traced_iterable`.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from skewtrace import semconv
from skewtrace.rank._events import PHASE
from skewtrace.rank._recorder import now_ns
from skewtrace.rank.hooks._context import HookContext
from skewtrace.rank.hooks._patches import Patches

_SUBCLASSES: dict[type, type] = {}
_ORIGINAL_CLASS = "_skewtrace_original_class"


BALANCE_TAG = "skewtrace_balance_tag"
"""A batch sampler's method ``(fetch index in the pass) -> (mode, version, cost version) or
None`` (:class:`skewtrace.rank.work_balance.WorkBalancedSampler` has it): each fetch's
``dataloader.fetch`` span carries the tag of the batch it returned. A DataLoader yields its
batches in its batch sampler's order, so the n-th fetch of a pass returns the sampler's n-th
batch of that pass, however far ahead the sampler and the workers run."""


class TracedIterator:
    """Wraps one pass over the loader; attribute access falls through to the real iterator."""

    def __init__(self, inner: Iterator[Any], ctx: HookContext) -> None:
        self._inner = inner
        self._ctx = ctx
        # The batch sampler's tag, read once per pass (a DataLoader's iterator holds its
        # batch sampler as _index_sampler); None for every other loader.
        self._tag = getattr(getattr(inner, "_index_sampler", None), BALANCE_TAG, None)
        self._fetches = 0

    def __iter__(self) -> TracedIterator:
        return self

    def __next__(self) -> Any:
        recorder = self._ctx.recorder
        if not recorder.active:
            batch = next(self._inner)
            self._fetches += 1
            return batch
        start = now_ns()
        batch = next(self._inner)
        end = now_ns()
        recorder.mark_activity(start)
        tag = None
        if self._tag is not None:
            try:
                tag = self._tag(self._fetches)
            except Exception:  # a tag never fails a fetch
                tag = None
        self._fetches += 1
        recorder.record(
            (PHASE, semconv.SPAN_DATALOADER_FETCH, recorder.step, start, end, None, None, None, tag)
        )
        return batch

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def traced_iterable(iterable: Iterable[Any], ctx: HookContext) -> Iterator[Any]:
    return TracedIterator(iter(iterable), ctx)


def _subclass_for(cls: type) -> type:
    sub = _SUBCLASSES.get(cls)
    if sub is None:

        def __iter__(self: Any) -> Iterator[Any]:
            inner = cls.__iter__(self)  # type: ignore[attr-defined]
            ctx = self.__dict__.get("_skewtrace_ctx")
            return inner if ctx is None else TracedIterator(inner, ctx)

        sub = type(
            cls.__name__,
            (cls,),
            {
                "__iter__": __iter__,
                _ORIGINAL_CLASS: cls,
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
            },
        )
        _SUBCLASSES[cls] = sub
    return sub


def instrument_dataloader(ctx: HookContext, loader: Any, patches: Patches) -> None:
    cls = type(loader)
    base = getattr(cls, _ORIGINAL_CLASS, None)
    if base is not None:  # already swapped by an earlier session: just retarget it
        loader.__dict__["_skewtrace_ctx"] = ctx
    else:
        if not hasattr(cls, "__iter__"):
            raise TypeError(f"dataloader={type(loader).__name__!r} is not iterable")
        try:
            loader.__dict__["_skewtrace_ctx"] = ctx
            loader.__class__ = _subclass_for(cls)
        except (TypeError, AttributeError):
            raise TypeError(
                f"skewtrace cannot instrument a {cls.__name__} in place; iterate over "
                "skewtrace.traced_iterable(loader) instead"
            ) from None
    ref = weakref.ref(loader)

    def restore() -> None:
        target = ref()
        if target is None:
            return
        target.__dict__.pop("_skewtrace_ctx", None)
        original = getattr(type(target), _ORIGINAL_CLASS, None)
        if original is not None:
            target.__class__ = original

    patches.on_restore(restore)


def patch_dataloader_class(ctx: HookContext, patches: Patches) -> None:
    """Zero-code: every ``torch.utils.data.DataLoader`` iteration is timed (evaluation
    loaders included: their fetches count toward the step in progress)."""
    from torch.utils.data import DataLoader

    original = DataLoader.__dict__["__iter__"]

    def __iter__(self: Any) -> Iterator[Any]:
        inner = original(self)
        return TracedIterator(inner, ctx) if ctx.recorder.active else inner

    patches.replace(DataLoader, "__iter__", __iter__, original)
