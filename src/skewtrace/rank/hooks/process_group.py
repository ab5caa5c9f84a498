"""Collectives seen where every API meets: the process group's own pre/post hooks.

``torch.distributed`` functions, the functional collectives that DTensor, tensor and
sequence parallel, FSDP2 and ``torch.distributed.pipelining`` use (``_c10d_functional``
ops), the coalesced and ``_into_tensor``/``_single`` variants, process-group methods called
directly and DDP's C++ reducer all reach a process group through the c10d dispatcher ops,
and from PyTorch 2.15 those ops call the group's registered pre- and post-hooks
(``ProcessGroup.register_pre_hook``/``register_post_hook``). Hooking there, instead of
wrapping Python functions, means a release that moves a call from one Python API to another
does not lose its span.

The pre-hook is the rank's arrival: it takes the group's next sequence number (the join key)
and the time. The post-hook gets the work the op returned: a synchronous collective ends
when ``torch.distributed`` has waited for it (``Work.wait`` returning, see :mod:`._work`);
an asynchronous one (``async_op=True``, and every functional collective, whose
``wait_tensor`` waits in C++) when its work's future completes. A work whose end cannot be
observed either way is recorded at the post-hook with the call's return as its end.

Point-to-point ops are left to :mod:`.point_to_point`, which knows the peer; calls made
while another skewtrace hook is running (a DDP bucket, a send) are skipped so nothing is
counted twice. Groups are hooked when instrumentation starts and as they are created
(``_register_pg_in_world``, where every ``new_group``/``split_group``/``init_process_group``
registers its group). Older PyTorch has no such hooks; there :func:`supported` is False and
the Python functions are wrapped instead (:mod:`.collectives`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

from skewtrace import semconv
from skewtrace.rank._events import COLLECTIVE
from skewtrace.rank._recorder import now_ns
from skewtrace.rank.hooks._context import GroupState, HookContext
from skewtrace.rank.hooks._patches import Patches
from skewtrace.rank.hooks.collectives import tensor_bytes

logger = logging.getLogger("skewtrace")

SOURCE, TIMING = semconv.SOURCE_API, semconv.TIMING_HOST

# Our id among a group's hooks (PyTorch's own flight recorder and NaN check use others).
HOOK_ID = 0x5C3E7

# c10d's op names -> the span's training.collective.op. Ops not named here (send and recv,
# which point_to_point traces; split, new_window, unknown) are neither traced nor counted:
# they are made by every member alike, so the numbering stays the same on all of them.
_OP_NAMES: dict[str, str] = {
    "ALLREDUCE": semconv.OP_ALL_REDUCE,
    "ALLREDUCE_COALESCED": semconv.OP_ALL_REDUCE,
    "ALLGATHER": semconv.OP_ALL_GATHER,
    "ALLGATHER_BASE": semconv.OP_ALL_GATHER,
    "ALLGATHER_COALESCED": semconv.OP_ALL_GATHER,
    "ALLGATHER_INTO_TENSOR_COALESCED": semconv.OP_ALL_GATHER,
    "REDUCE_SCATTER": semconv.OP_REDUCE_SCATTER,
    "REDUCE_SCATTER_BASE": semconv.OP_REDUCE_SCATTER,
    "REDUCE_SCATTER_TENSOR_COALESCED": semconv.OP_REDUCE_SCATTER,
    "ALLTOALL": semconv.OP_ALL_TO_ALL,
    "ALLTOALL_BASE": semconv.OP_ALL_TO_ALL,
    "BROADCAST": semconv.OP_BROADCAST,
    "REDUCE": semconv.OP_REDUCE,
    "GATHER": semconv.OP_GATHER,
    "SCATTER": semconv.OP_SCATTER,
    "BARRIER": semconv.OP_BARRIER,
}


def supported() -> bool:
    """Whether the installed PyTorch calls hooks registered on a process group."""
    try:
        from torch._C._distributed_c10d import HookOpName, ProcessGroup
    except ImportError:
        return False
    return hasattr(ProcessGroup, "register_pre_hook") and hasattr(HookOpName, "ALLREDUCE")


def _op_table() -> dict[int, str]:
    """The traced ops by their ``HookOpName`` value: the hooks look an op up by
    ``args.name.value``, an int (0.1 us), not by the enum object (whose hash and equality are
    pybind calls: 0.35 us; docs/performance.md)."""
    from torch._C._distributed_c10d import HookOpName

    return {
        int(member.value): _OP_NAMES[name]
        for name, member in HookOpName.__members__.items()
        if name in _OP_NAMES
    }


class ProcessGroupHooks:
    """The hooks of one instrumentation session on every group this rank is in."""

    def __init__(self, ctx: HookContext, skip: Callable[[Any], bool] | None = None) -> None:
        self.ctx = ctx
        # Groups whose collectives are read elsewhere (c10d's Flight Recorder) are not hooked.
        self.skip = skip
        self._ops = _op_table()
        self._hooked: weakref.WeakSet[Any] = weakref.WeakSet()
        import torch.distributed.distributed_c10d as c10d

        self._c10d = c10d
        # The ids of the groups attach_existing last went through (ids, not the groups: a
        # destroyed group is not kept alive here).
        self._known: tuple[int, ...] = ()

    # -- groups ---------------------------------------------------------------------------
    def attach(self, pg: Any) -> None:
        """Hook ``pg`` (once). Never raises: a group we cannot hook is logged and skipped."""
        try:
            if pg in self._hooked or (self.skip is not None and self.skip(pg)):
                return
            pre, post = self._hooks_for(weakref.ref(pg))
            pg.register_pre_hook(HOOK_ID, pre)
            pg.register_post_hook(HOOK_ID, post)
            self._hooked.add(pg)
        except Exception:
            logger.warning("skewtrace: process group not hooked; its collectives are not "
                           "traced", exc_info=True)  # fmt: skip

    def attach_existing(self) -> None:
        """Hook the groups c10d knows of that are not hooked yet. Called at every step's end:
        when the groups are the ones of the last call (compared by identity, a few tens of
        nanoseconds) there is nothing to do."""
        groups = list(getattr(self._c10d._world, "pg_map", ()))
        known = tuple(map(id, groups))
        if known == self._known:
            return
        for pg in groups:
            self.attach(pg)
        self._known = known

    def detach_all(self) -> None:
        for pg in list(self._hooked):
            with contextlib.suppress(Exception):
                pg.unregister_pre_hook(HOOK_ID)
                pg.unregister_post_hook(HOOK_ID)
        self._hooked = weakref.WeakSet()
        self._known = ()

    # -- the hooks ------------------------------------------------------------------------
    def _hooks_for(
        self, pg_ref: weakref.ref[Any]
    ) -> tuple[Callable[[Any], None], Callable[[Any], None]]:
        # The hot path (docs/performance.md has the breakdown): each of the two hooks is one
        # C++-to-Python call, and most of what they cost is reading the args pybind builds
        # (the op's name alone is an enum object, about 0.5 us; the work about 0.6 us) and, for
        # an asynchronous op, the work's future. What is ours is kept to a clock read, one
        # tuple and a partial: no closures built per call, no context managers, no method
        # calls on the hot path beyond ``record``.
        ctx = self.ctx
        recorder = ctx.recorder
        tls = ctx.tls
        ops = self._ops
        # What the pre-hook saw until the post-hook has the work: c10d calls the two one right
        # after the other on the issuing thread, around the backend's call, so one slot per
        # group is enough (reading the op's id in both would cost 0.3 us each).
        # (step, start, op, pg name, pg size, seq, nbytes, is_async, cuda handle)
        pending: list[tuple[Any, ...] | None] = [None]
        record = recorder.record
        works = ctx.works
        # Resolved at the group's first collective: when init_process_group registers the
        # world group it is not yet the default one, and the name depends on that.
        group: list[GroupState | None] = []

        def pre(args: Any) -> None:
            # Called from C++ inside the op: never raise (it would fail the collective).
            try:
                if tls.depth or not recorder.active:
                    return
                op = ops.get(args.name.value)
                if op is None:
                    return
                if not group:
                    pg = pg_ref()
                    group.append(ctx.group_state(pg) if pg is not None else None)
                state = group[0]
                if state is None:
                    return
                seq = state.seq
                state.seq = seq + 1
                is_async = args.async_op
                inputs = args.input_tensors
                if ctx.pacer is not None:
                    ctx.maybe_pace()
                handle = None
                if ctx.cuda_timer is not None and not is_async and inputs and inputs[0].is_cuda:
                    # Synchronous NCCL: an event on the current stream before the op marks
                    # this rank's arrival; one after wait() (which makes the stream wait for
                    # the collective) its completion.
                    handle = ctx.cuda_timer.start()
                nbytes = inputs[0].nbytes if len(inputs) == 1 else tensor_bytes(inputs)
                pending[0] = (
                    recorder.step, now_ns(), op, state.name, state.size, seq, nbytes, is_async,
                    handle,
                )  # fmt: skip
            except Exception:
                logger.debug("skewtrace: collective not traced", exc_info=True)

        def completed(arrival: tuple[Any, ...], _future: Any = None) -> None:
            # An asynchronous op's work completed: on a c10d thread (a future's callback),
            # in Work.wait(), or on the export thread's poll. Never raise there.
            try:
                step, start, op, name, size, seq, nbytes = arrival[:7]
                record((COLLECTIVE, step, start, now_ns(), op, name, size, seq, nbytes, True,
                        SOURCE, TIMING, None, None))  # fmt: skip
            except Exception:
                pass

        def waited(arrival: tuple[Any, ...]) -> None:
            # A synchronous op: torch.distributed's wait() returned (or, where that cannot be
            # seen, the call did).
            step, start, op, name, size, seq, nbytes, is_async, handle = arrival
            if handle is not None:
                ctx.cuda_timer.stop(handle)  # type: ignore[union-attr]
            record((COLLECTIVE, step, start, now_ns(), op, name, size, seq, nbytes, is_async,
                    SOURCE, TIMING, handle, None))  # fmt: skip

        def post(args: Any) -> None:
            try:
                arrival = pending[0]
                if arrival is None:
                    return
                pending[0] = None
                work = args.work
                if arrival[7] and work is not None:
                    # Asynchronous: it ends when its work's future completes; a work with no
                    # future when its wait() returns, else (no way to see it) now.
                    try:
                        future = work.get_future()
                    except Exception:
                        future = None
                    if future is not None:
                        future.add_done_callback(partial(completed, arrival))
                    elif type(work).wait is works.wrapper is not None:
                        works.expect(work, partial(completed, arrival))
                    else:
                        completed(arrival)
                    return
                if work is not None and type(work).wait is works.wrapper is not None:
                    works.expect(work, partial(waited, arrival))
                else:
                    waited(arrival)
            except Exception:
                logger.debug("skewtrace: collective not traced", exc_info=True)

        return pre, post


def patch_process_groups(
    ctx: HookContext, patches: Patches, skip: Callable[[Any], bool] | None = None
) -> ProcessGroupHooks:
    """Hook every group this rank is in now, and each one created later (but those ``skip``
    says are traced another way)."""
    import torch.distributed.distributed_c10d as c10d

    hooks = ProcessGroupHooks(ctx, skip)
    register = getattr(c10d, "_register_pg_in_world", None)
    if register is not None:

        @functools.wraps(register)
        def register_pg_in_world(pg: Any, *args: Any, **kwargs: Any) -> Any:
            result = register(pg, *args, **kwargs)
            hooks.attach(pg)
            return result

        patches.replace(c10d, "_register_pg_in_world", register_pg_in_world, register)
    else:
        logger.warning(
            "skewtrace: this PyTorch has process-group hooks but no _register_pg_in_world; "
            "groups created after instrument() are hooked at the next step boundary"
        )
    hooks.attach_existing()
    patches.on_restore(hooks.detach_all)
    return hooks
