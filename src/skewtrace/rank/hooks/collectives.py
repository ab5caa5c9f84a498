"""Spans for collectives: the torch.distributed functions and DDP's gradient buckets.

Each traced call takes the next number of its group's counter (the join key the collector
uses with the job and the group name) and records a ``CollectiveEvent``. For
``async_op=True`` the end is read when the work's future completes, not when the call
returns. DDP buckets go
through a communication hook that wraps the user's own hook (or the default all-reduce);
while it runs, the patched functions pass calls straight through so a bucket is counted once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any

from skewtrace import semconv
from skewtrace.rank._events import COLLECTIVE
from skewtrace.rank._recorder import now_ns
from skewtrace.rank.hooks._context import HookContext
from skewtrace.rank.hooks._patches import Patches
from skewtrace.semconv import SOURCE_API, SOURCE_DDP, TIMING_HOST

logger = logging.getLogger("skewtrace")


# function name -> (op, input position, input keyword, group position, async position)
COLLECTIVE_FUNCTIONS: dict[str, tuple[str, int | None, str | None, int, int]] = {
    "all_reduce": (semconv.OP_ALL_REDUCE, 0, "tensor", 2, 3),
    "all_gather": (semconv.OP_ALL_GATHER, 1, "tensor", 2, 3),
    "all_gather_into_tensor": (semconv.OP_ALL_GATHER, 1, "input_tensor", 2, 3),
    "_all_gather_base": (semconv.OP_ALL_GATHER, 1, "input_tensor", 2, 3),
    "reduce_scatter": (semconv.OP_REDUCE_SCATTER, 1, "input_list", 3, 4),
    "reduce_scatter_tensor": (semconv.OP_REDUCE_SCATTER, 1, "input", 3, 4),
    "_reduce_scatter_base": (semconv.OP_REDUCE_SCATTER, 1, "input", 3, 4),
    "broadcast": (semconv.OP_BROADCAST, 0, "tensor", 2, 3),
    "barrier": (semconv.OP_BARRIER, None, None, 0, 1),
    "all_to_all": (semconv.OP_ALL_TO_ALL, 1, "input_tensor_list", 2, 3),
    "all_to_all_single": (semconv.OP_ALL_TO_ALL, 1, "input", 4, 5),
    "reduce": (semconv.OP_REDUCE, 0, "tensor", 3, 4),
    "gather": (semconv.OP_GATHER, 0, "tensor", 3, 4),
    "scatter": (semconv.OP_SCATTER, 1, "scatter_list", 3, 4),
}


def tensor_bytes(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(item) for item in value)
    try:
        return int(value.numel()) * int(value.element_size())
    except AttributeError:
        return 0


def _on_cuda(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return bool(getattr(value, "is_cuda", False))


def _argument(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    position: int | None,
    name: str | None,
    default: Any = None,
) -> Any:
    if position is not None and len(args) > position:
        return args[position]
    if name is not None:
        return kwargs.get(name, default)
    return default


def _record_when_done(
    ctx: HookContext, work: Any, step: int, start: int, fields: tuple[Any, ...]
) -> bool:
    """Record the event when ``work`` completes; False if its completion cannot be observed.

    ``fields`` are the :class:`~skewtrace.rank._events.CollectiveEvent` fields after ``end_ns``."""
    try:
        future = work.get_future()
    except Exception:
        return False
    record = ctx.recorder.record

    def done(_future: Any) -> None:
        # Runs on a c10d thread: never raise there.
        with contextlib.suppress(Exception):
            record((COLLECTIVE, step, start, now_ns(), *fields))

    future.add_done_callback(done)
    return True


def _wrap_collective(
    ctx: HookContext,
    original: Callable[..., Any],
    spec: tuple[str, int | None, str | None, int, int],
) -> Callable[..., Any]:
    op, input_pos, input_name, group_pos, async_pos = spec
    recorder = ctx.recorder
    tls = ctx.tls

    @functools.wraps(original)
    def traced_collective(*args: Any, **kwargs: Any) -> Any:
        if not recorder.active or ctx.depth():
            return original(*args, **kwargs)
        try:
            group = _argument(args, kwargs, group_pos, "group")
            state = ctx.group_state(group)
            if state is None:
                return original(*args, **kwargs)
            is_async = bool(_argument(args, kwargs, async_pos, "async_op", False))
            nbytes = tensor_bytes(_argument(args, kwargs, input_pos, input_name))
            seq = state.next_seq()
            ctx.maybe_pace()
        except Exception:
            logger.debug("skewtrace: collective %s not traced", op, exc_info=True)
            return original(*args, **kwargs)
        step = recorder.step
        cuda_timer = ctx.cuda_timer
        handle = None
        if (
            cuda_timer is not None
            and not is_async
            and _on_cuda(_argument(args, kwargs, input_pos, input_name))
        ):
            # A synchronous NCCL call returns once the work is queued; the current stream
            # then waits for it. Events on that stream before and after span this rank's
            # arrival to the collective's completion.
            handle = cuda_timer.start()
        tls.depth = 1
        start = now_ns()
        try:
            work = original(*args, **kwargs)
        finally:
            tls.depth = 0
        if handle is not None and cuda_timer is not None:
            cuda_timer.stop(handle)
        end = now_ns()
        if is_async and work is not None:
            fields = (
                op, state.name, state.size, seq, nbytes, True, SOURCE_API, TIMING_HOST, None, None
            )  # fmt: skip
            if _record_when_done(ctx, work, step, start, fields):
                return work
        recorder.record(
            (
                COLLECTIVE,
                step,
                start,
                end,
                op,
                state.name,
                state.size,
                seq,
                nbytes,
                is_async,
                SOURCE_API,
                TIMING_HOST,
                handle,
                None,
            )
        )
        return work

    return traced_collective


def patch_collectives(ctx: HookContext, patches: Patches) -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name, spec in COLLECTIVE_FUNCTIONS.items():
        original = getattr(c10d, name, None)
        if original is None:
            continue
        wrapper = _wrap_collective(ctx, original, spec)
        patches.replace(c10d, name, wrapper, original)
        if getattr(dist, name, None) is original:
            patches.replace(dist, name, wrapper, original)


class CommHookSlot:
    """What skewtrace's DDP hook forwards to, and the session it records into.

    The reducer accepts one hook for its lifetime, so the hook stays registered after
    uninstrument; with ``ctx`` None it only forwards (to the user's hook or the default
    all-reduce), and a later instrument() points ``ctx`` at the new session.
    """

    def __init__(self, ctx: HookContext | None) -> None:
        self.ctx = ctx
        self.hook: Callable[[Any, Any], Any] | None = None
        self.state: Any = None
        # (session, its counter of the model's group): looked up at the session's first
        # bucket, not at every one.
        self.group: tuple[HookContext, Any] | None = None


def make_ddp_comm_hook(process_group: Any, slot: CommHookSlot) -> Callable[[Any, Any], Any]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def forward(bucket: Any) -> Any:
        if slot.hook is None:
            return default_hooks.allreduce_hook(process_group, bucket)
        return slot.hook(slot.state, bucket)

    def skewtrace_comm_hook(state: Any, bucket: Any) -> Any:
        ctx = slot.ctx
        if ctx is None or not ctx.recorder.active or ctx.depth():
            return forward(bucket)
        recorder = ctx.recorder
        tls = ctx.tls
        try:
            cached = slot.group
            if cached is not None and cached[0] is ctx:
                group_state = cached[1]
            else:
                group_state = ctx.group_state(process_group)
                slot.group = (ctx, group_state)
            nbytes = bucket.buffer().nbytes
            if group_state is not None:
                ctx.maybe_pace()
        except Exception:
            logger.debug("skewtrace: DDP bucket not traced", exc_info=True)
            group_state = None
        if group_state is None:
            return forward(bucket)
        seq = group_state.next_seq()
        step = recorder.step
        tls.depth = 1
        start = now_ns()
        try:
            future = forward(bucket)
        finally:
            tls.depth = 0
        fields = (
            "all_reduce",
            group_state.name,
            group_state.size,
            seq,
            nbytes,
            True,
            SOURCE_DDP,
            TIMING_HOST,
            None,
            None,
        )
        record = recorder.record

        def done(_future: Any) -> None:
            # Runs on a c10d thread: never raise there.
            try:  # noqa: SIM105 (contextlib.suppress: ~0.5 us per bucket)
                record((COLLECTIVE, step, start, now_ns(), *fields))
            except Exception:
                pass

        try:
            future.add_done_callback(done)
        except Exception:
            record((COLLECTIVE, step, start, now_ns(), *fields))
        return future

    # DDP checks the annotations against dist.GradBucket objects; postponed (string)
    # annotations would fail that check, and an unannotated hook passes it.
    skewtrace_comm_hook.__annotations__ = {}
    return skewtrace_comm_hook


def _register_comm_hook(self: Any, state: Any, hook: Callable[..., Any]) -> None:
    """DistributedDataParallel.register_comm_hook while instrumented: the user's hook goes
    behind skewtrace's (already registered) hook instead of failing as a second hook."""
    slot = getattr(self, "_skewtrace_comm_hook_slot", None)
    if slot is None or slot.hook is not None:
        original = _register_comm_hook._skewtrace_original  # type: ignore[attr-defined]
        return original(self, state, hook)
    self._check_comm_hook(hook)
    slot.hook, slot.state = hook, state
    self._comm_hooks.append((hook, state))
    return None


def patch_ddp_register(patches: Patches) -> None:
    from torch.nn.parallel import DistributedDataParallel

    original = DistributedDataParallel.__dict__["register_comm_hook"]
    patches.replace(DistributedDataParallel, "register_comm_hook", _register_comm_hook, original)


def instrument_ddp(ctx: HookContext, model: Any) -> bool:
    """Route ``model``'s gradient buckets through skewtrace's comm hook.

    Returns False when a comm hook was registered before instrumentation: the reducer accepts
    one hook only, so the buckets then show up through the patched dist functions the user's
    hook calls (source ``api``), and a warning says so.
    """
    slot = getattr(model, "_skewtrace_comm_hook_slot", None)
    if slot is not None:
        slot.ctx = ctx
        return True
    if getattr(model, "_comm_hooks", None):
        logger.warning(
            "skewtrace: %s already has a communication hook; its collectives are traced as "
            "source=api. Call skewtrace.instrument() before register_comm_hook() to trace "
            "buckets as source=ddp.",
            type(model).__name__,
        )
        return False
    slot = CommHookSlot(ctx)
    hook = make_ddp_comm_hook(model.process_group, slot)
    model.register_comm_hook(state=None, hook=hook)
    # register_comm_hook recorded our hook as the user's; keep that list for user hooks.
    model._comm_hooks.clear()
    model._skewtrace_comm_hook_slot = slot
    return True


def detach_ddp(model: Any) -> None:
    slot = getattr(model, "_skewtrace_comm_hook_slot", None)
    if slot is not None:
        slot.ctx = None
