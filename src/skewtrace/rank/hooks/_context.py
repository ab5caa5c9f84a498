"""State shared by the hooks of one instrumentation session."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from skewtrace import semconv
from skewtrace.rank._events import PACING
from skewtrace.rank._recorder import Recorder, now_ns
from skewtrace.rank.hooks._work import WorkWaits

if TYPE_CHECKING:
    # Only the type: the client itself (urllib, the decision body) loads when pacing is on.
    from skewtrace.rank.pacing_client import RankPacer

logger = logging.getLogger("skewtrace")


class GroupState:
    """Our per-group sequence counter: in SPMD code every member makes the same calls in
    the same order, so the n-th call on a group has the same number on every member."""

    __slots__ = ("messages", "name", "seq", "size")

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self.seq = 0
        # Point-to-point messages counted per (sender, receiver): the n-th message from one
        # rank to another in this group has the same number on both sides.
        self.messages: dict[tuple[int, int], int] = {}

    def next_seq(self) -> int:
        seq = self.seq
        self.seq = seq + 1
        return seq

    def next_message(self, src: int, dst: int) -> int:
        seq = self.messages.get((src, dst), 0)
        self.messages[(src, dst)] = seq + 1
        return seq


class HookLocal(threading.local):
    """Per-thread hook state. A class attribute as the default: reading an attribute a
    thread never set would otherwise raise and catch AttributeError (about 1 us)."""

    depth = 0
    in_backward = False


class HookContext:
    def __init__(
        self,
        recorder: Recorder,
        pacer: RankPacer | None = None,
        device: Any | None = None,
        cuda_timer: Any | None = None,
    ) -> None:
        self.recorder = recorder
        self.pacer = pacer
        self.device = device
        self.cuda_timer = cuda_timer
        # depth > 0 while this thread is inside a traced collective or a DDP hook: nested
        # collectives (a user comm hook calling dist.all_reduce) are not counted twice.
        self.tls = HookLocal()
        # What Work.wait() returning completes (see hooks._work).
        self.works = WorkWaits(recorder.count_drop)
        # The process-group hooks (hooks.process_group), where the installed PyTorch has them.
        self.process_groups: Any | None = None
        # Set once the rank sent or received a point-to-point message: a pipeline stage
        # (hooks.layers profiles its model's layers then).
        self.p2p_seen = False
        self._groups: dict[Any, GroupState] = {}
        self._groups_lock = threading.Lock()
        self._pacing_failed_logged = False
        # Where the step's delay goes. With an instrumented model: before its forward, so the
        # paced rank's compute, and with it its arrival at the gradient collectives where it
        # would otherwise wait, moves later. Without one: before the step's first collective.
        # Not before the first collective when a model is known: in a typical loop that is a
        # loss or metric all-reduce issued right after the gradient sync, where every rank
        # arrives together, so a delay there makes the paced rank the latest and every other
        # rank waits for it.
        self.pace_before_forward = False

    def depth(self) -> int:
        return self.tls.depth

    def group_state(self, group: Any) -> GroupState | None:
        """The counter of ``group`` (None = the world group); None if this rank is not in it."""
        import torch.distributed.distributed_c10d as c10d

        world = c10d.GroupMember.WORLD
        pg = world if group is None else group
        state = self._groups.get(pg)
        if state is not None:
            return state
        if pg is None or pg is c10d.GroupMember.NON_GROUP_MEMBER:
            return None
        if c10d._rank_not_in_group(pg):
            return None
        if pg is world:
            name = semconv.DEFAULT_PG_NAME
        else:
            name = str(getattr(pg, "group_name", "") or c10d._get_process_group_name(pg))
        with self._groups_lock:
            state = self._groups.setdefault(pg, GroupState(name, int(pg.size())))  # type: ignore[union-attr]
        return state

    def maybe_pace(self, *, at_forward: bool = False) -> None:
        """Once per step, before the model's forward (or, with no model, before the step's
        first collective): apply the pacer's current delay."""
        recorder = self.recorder
        pacer = self.pacer
        if (
            pacer is None
            or at_forward != self.pace_before_forward
            or recorder.paced_step == recorder.step
        ):
            return
        recorder.paced_step = recorder.step
        try:
            started_ns = recorder.step_start_ns
            if started_ns is not None:
                # The step's start for the pacer's time line of every job's phases (the
                # poll thread sends its age); on the monotonic clock, which polls read.
                pacer.note_step_start(time.monotonic() - (now_ns() - started_ns) / 1e9)
            delay, version = pacer.current_delay()
            # The interleave policy's hold for this rank's process groups: the larger of the
            # two is applied (a delay already holds the rank that long).
            with self._groups_lock:
                names = [state.name for state in self._groups.values()]
            delay = max(delay, pacer.current_hold(names))
            if delay <= 0:
                return
            from skewtrace.rank.pacing_client import apply_delay

            start = now_ns()
            apply_delay(delay, self.device)
            recorder.record((PACING, recorder.step, start, now_ns(), float(delay), int(version)))
        except Exception:
            # Pacing fails open: a broken pacer never stops training.
            if not self._pacing_failed_logged:
                self._pacing_failed_logged = True
                logger.warning("skewtrace: pacing failed; continuing without", exc_info=True)
