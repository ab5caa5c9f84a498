"""When a ``Work`` completes: through its future, else when ``Work.wait()`` returns.

A collective or message issued asynchronously ends when its work does, not when the call
returns. Backends with futures on their works (NCCL, and gloo for collectives) call back on
a c10d thread; gloo's point-to-point works have none, and synchronous collectives are waited
for by ``torch.distributed`` itself, so for those the end is read when ``wait()`` returns.
One wrapper of ``Work.wait`` serves every hook: :class:`WorkWaits` holds what each expected
work does when waited, bounded (the oldest dropped and counted when a program never waits);
a work waited for only in C++ is found done by the export thread's :meth:`WorkWaits.poll`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

from skewtrace.rank.hooks._patches import Patches

# Works expected to be waited for; past this the oldest is dropped and counted.
MAX_WAITING = 4096
DROP_REASON_NEVER_WAITED = "work_never_waited"


class WorkWaits:
    """What to do when an expected work's ``wait()`` returns, keyed by the work.

    A plain dict, no lock: its single-key operations are atomic under the GIL, and the hot
    path (a synchronous collective: one ``expect`` and one ``waited``) stays a few hundred
    nanoseconds."""

    def __init__(self, count_drop: Callable[..., None]) -> None:
        self._waiting: dict[int, tuple[Any, Callable[[], None]]] = {}
        self._count_drop = count_drop
        # The Work.wait patch_work_wait installed; a work whose class overrides wait() (a
        # backend written in Python) is never seen waiting through it.
        self.wrapper: Any = None

    def observes(self, work: Any) -> bool:
        """Whether ``work.wait()`` goes through our wrapper."""
        return self.wrapper is not None and type(work).wait is self.wrapper

    def expect(self, work: Any, on_waited: Callable[[], None]) -> None:
        waiting = self._waiting
        waiting[id(work)] = (work, on_waited)
        if len(waiting) > MAX_WAITING:
            # Oldest first (dicts keep insertion order); a racing thread may have taken it.
            with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                del waiting[next(iter(waiting))]
                self._count_drop(DROP_REASON_NEVER_WAITED)

    def waited(self, work: Any) -> None:
        """``work.wait()`` returned: run what was expected of it (once)."""
        waiting = self._waiting
        if not waiting:
            return
        entry = waiting.pop(id(work), None)
        if entry is not None and entry[0] is work:
            entry[1]()

    def poll(self) -> None:
        """Complete the expected works that are done (on the export thread, each cycle).

        For a work with no future that is waited for in C++ (a functional collective whose
        ``wait_tensor`` waits, on a backend like gloo whose coalesced works have no future),
        ``wait()`` is never seen: its end is when this finds it done, up to one export
        interval late. (Gloo's coalesced works, which the functional all-gather and
        reduce-scatter issue on gloo, report completion to neither: those spans are lost, and
        counted as dropped when instrumentation ends.)"""
        for key, (work, on_done) in list(self._waiting.items()):
            try:
                if not work.is_completed():
                    continue
            except Exception:
                continue
            if self._waiting.pop(key, None) is not None:
                with contextlib.suppress(Exception):
                    on_done()

    def abandon(self) -> None:
        """Instrumentation ends: what still waits will never be recorded; count it."""
        left = len(self._waiting)
        self._waiting.clear()
        if left:
            self._count_drop(DROP_REASON_NEVER_WAITED, left)

    def __len__(self) -> int:
        return len(self._waiting)


def when_done(work: Any, on_done: Callable[[], None], waits: WorkWaits) -> None:
    """Run ``on_done`` once ``work`` completes: by its future where it has one, else when
    its ``wait()`` returns."""
    try:
        future = work.get_future()
    except Exception:
        future = None
    if future is None:
        if waits.observes(work):
            waits.expect(work, on_done)
        else:
            on_done()  # no way to see it complete: its end is the call's return
        return

    def done(_future: Any) -> None:
        # Runs on a c10d thread: never raise there.
        try:  # noqa: SIM105 (contextlib.suppress: a context manager per call, ~0.5 us)
            on_done()
        except Exception:
            pass

    future.add_done_callback(done)


def patch_work_wait(waits: WorkWaits, patches: Patches) -> None:
    """Route every ``Work.wait()`` through ``waits`` (one Python call around the C++ wait)."""
    import torch.distributed.distributed_c10d as c10d

    work_type = c10d.Work
    original_wait = work_type.wait
    waited = waits.waited
    # Every wait() of every work pays this wrapper, an asynchronous collective's included
    # (whose end its future reports): with nothing expected it is one truth test of the dict.
    waiting = waits._waiting

    @functools.wraps(original_wait)
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original_wait(self, *args, **kwargs)
        if waiting:
            try:  # noqa: SIM105 (as above: on every wait())
                waited(self)
            except Exception:
                pass
        return result

    patches.replace(work_type, "wait", wait, original_wait)
    waits.wrapper = wait
    patches.on_restore(lambda: setattr(waits, "wrapper", None))
