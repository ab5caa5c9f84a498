"""When a ``Work`` completes: through its future, else when ``Work.wait()`` returns.

A collective or message issued asynchronously ends when its work does, not when the call
returns. Backends with futures on their works (NCCL, and gloo for collectives) call back on
a c10d thread; gloo's point-to-point works have none, and synchronous collectives are waited
for by ``torch.distributed`` itself, so for those the end is read when ``wait()`` returns.
One wrapper of ``Work.wait`` serves every hook: :class:`WorkWaits` holds what each expected
work does when waited, bounded (the oldest dropped and counted when a program never waits).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from skewtrace.hooks._patches import Patches

# Works expected to be waited for; past this the oldest is dropped and counted.
MAX_WAITING = 4096
DROP_REASON_NEVER_WAITED = "work_never_waited"


class WorkWaits:
    """What to do when an expected work's ``wait()`` returns, keyed by the work."""

    def __init__(self, count_drop: Callable[[str], None]) -> None:
        self._waiting: OrderedDict[int, tuple[Any, Callable[[], None]]] = OrderedDict()
        self._lock = threading.Lock()
        self._count_drop = count_drop

    def expect(self, work: Any, on_waited: Callable[[], None]) -> None:
        with self._lock:
            self._waiting[id(work)] = (work, on_waited)
            overflow = len(self._waiting) > MAX_WAITING
            if overflow:
                self._waiting.popitem(last=False)
        if overflow:
            self._count_drop(DROP_REASON_NEVER_WAITED)

    def waited(self, work: Any) -> None:
        """``work.wait()`` returned: run what was expected of it (once)."""
        if not self._waiting:
            return
        with self._lock:
            entry = self._waiting.pop(id(work), None)
        if entry is not None and entry[0] is work:
            entry[1]()

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
        waits.expect(work, on_done)
        return

    def done(_future: Any) -> None:
        # Runs on a c10d thread: never raise there.
        with contextlib.suppress(Exception):
            on_done()

    future.add_done_callback(done)


def patch_work_wait(waits: WorkWaits, patches: Patches) -> None:
    """Route every ``Work.wait()`` through ``waits`` (one Python call around the C++ wait)."""
    import torch.distributed.distributed_c10d as c10d

    work_type = c10d.Work
    original_wait = work_type.wait
    waited = waits.waited

    @functools.wraps(original_wait)
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original_wait(self, *args, **kwargs)
        with contextlib.suppress(Exception):
            waited(self)
        return result

    patches.replace(work_type, "wait", wait, original_wait)
