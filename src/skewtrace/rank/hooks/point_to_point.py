"""Spans for point-to-point messages: ``send``, ``recv``, ``isend``, ``irecv`` and
``batch_isend_irecv`` (pipeline parallelism).

Each side of a message records a ``collective.send`` or ``collective.recv`` span with the
other rank (``training.collective.peer``, a global rank) and the number of the message
among those from that sender to that receiver in that group
(``training.collective.seq``): the collector joins the sender's span with the receiver's
by it, so a slow pipeline stage is attributed to its rank. Blocking calls end when they
return; asynchronous ones when their work completes: through the work's future where the
backend has one (NCCL), else when ``Work.wait()`` returns (gloo has no futures for
point-to-point works). A ``batch_isend_irecv`` records one span per operation, from the
batch's start to the completion of its work. An ``irecv`` from any source (``src=None``)
cannot be joined and is not traced.
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
from skewtrace.rank.hooks._context import GroupState, HookContext
from skewtrace.rank.hooks._patches import Patches
from skewtrace.rank.hooks._work import when_done
from skewtrace.rank.hooks.collectives import tensor_bytes

logger = logging.getLogger("skewtrace")

SEND, RECV = semconv.OP_SEND, semconv.OP_RECV


def _global_peer(group: Any, peer: int | None, group_peer: int | None) -> int | None:
    """The peer as a global rank, from ``dst``/``src`` or ``group_dst``/``group_src``."""
    if peer is not None:
        return int(peer)
    if group_peer is None:
        return None
    import torch.distributed as dist

    if group is None:
        return int(group_peer)
    return int(dist.get_global_rank(group, group_peer))


class _Message:
    """What one side of a message records once it is done."""

    __slots__ = ("fields", "start", "step")

    def __init__(self, step: int, start: int, fields: tuple[Any, ...]) -> None:
        self.step = step
        self.start = start
        self.fields = fields

    def record(self, ctx: HookContext) -> None:
        with contextlib.suppress(Exception):
            ctx.recorder.record((COLLECTIVE, self.step, self.start, now_ns(), *self.fields))


class PointToPoint:
    """The wrappers of one instrumentation session."""

    def __init__(self, ctx: HookContext) -> None:
        self.ctx = ctx

    # -- what a message is ------------------------------------------------------------------
    def _message(
        self, op: str, tensor: Any, group: Any, peer: int, is_async: bool, start: int
    ) -> _Message | None:
        """The message's span fields (and its number), or None when the rank is not in the
        group."""
        import torch.distributed as dist

        state: GroupState | None = self.ctx.group_state(group)
        if state is None:
            return None
        me = dist.get_rank()
        src, dst = (me, peer) if op == SEND else (peer, me)
        seq = state.next_message(src, dst)
        self.ctx.p2p_seen = True
        fields = (
            op,
            state.name,
            state.size,
            seq,
            tensor_bytes(tensor),
            is_async,
            semconv.SOURCE_API,
            semconv.TIMING_HOST,
            None,
            peer,
        )
        return _Message(self.ctx.recorder.step, start, fields)

    def _when_done(self, work: Any, messages: list[_Message]) -> None:
        """Record ``messages`` when ``work`` completes (its future, else its wait())."""
        ctx = self.ctx

        def done() -> None:
            for message in messages:
                message.record(ctx)

        when_done(work, done, ctx.works)

    # -- the wrappers ------------------------------------------------------------------------
    def blocking(self, original: Callable[..., Any], op: str) -> Callable[..., Any]:
        ctx = self

        @functools.wraps(original)
        def traced(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            hook = ctx.ctx
            if not hook.recorder.active or hook.depth():
                return original(tensor, *args, **kwargs)
            try:
                peer_arg, group, group_peer = _peer_args(op, args, kwargs)
                peer = _global_peer(group, peer_arg, group_peer)
                hook.maybe_pace()
            except Exception:
                logger.debug("skewtrace: %s not traced", op, exc_info=True)
                return original(tensor, *args, **kwargs)
            hook.tls.depth = 1
            start = now_ns()
            try:
                result = original(tensor, *args, **kwargs)
            finally:
                hook.tls.depth = 0
            if peer is None and op == RECV and isinstance(result, int):
                peer = result  # recv from any source returns the sender
            if peer is not None:
                with contextlib.suppress(Exception):
                    message = ctx._message(op, tensor, group, peer, False, start)
                    if message is not None:
                        message.record(hook)
            return result

        return traced

    def asynchronous(self, original: Callable[..., Any], op: str) -> Callable[..., Any]:
        ctx = self

        @functools.wraps(original)
        def traced(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            hook = ctx.ctx
            if not hook.recorder.active or hook.depth():
                return original(tensor, *args, **kwargs)
            message = None
            try:
                peer_arg, group, group_peer = _peer_args(op, args, kwargs)
                peer = _global_peer(group, peer_arg, group_peer)
                if peer is not None:
                    hook.maybe_pace()
                    message = ctx._message(op, tensor, group, peer, True, now_ns())
            except Exception:
                logger.debug("skewtrace: %s not traced", op, exc_info=True)
            hook.tls.depth = 1
            try:
                work = original(tensor, *args, **kwargs)
            finally:
                hook.tls.depth = 0
            if message is not None and work is not None:
                with contextlib.suppress(Exception):
                    ctx._when_done(work, [message])
            return work

        return traced

    def batch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        ctx = self

        @functools.wraps(original)
        def traced(p2p_op_list: Any, *args: Any, **kwargs: Any) -> Any:
            hook = ctx.ctx
            if not hook.recorder.active or hook.depth():
                return original(p2p_op_list, *args, **kwargs)
            messages: list[_Message] = []
            try:
                import torch.distributed.distributed_c10d as c10d

                start = now_ns()
                hook.maybe_pace()
                for p2p_op in p2p_op_list:
                    sends = p2p_op.op is c10d.isend or getattr(p2p_op.op, "__name__", "") == "isend"
                    op = SEND if sends else RECV
                    peer = _global_peer(p2p_op.group, p2p_op.peer, p2p_op.group_peer)
                    if peer is None:
                        continue
                    message = ctx._message(op, p2p_op.tensor, p2p_op.group, peer, True, start)
                    if message is not None:
                        messages.append(message)
            except Exception:
                logger.debug("skewtrace: batch_isend_irecv not traced", exc_info=True)
                messages = []
            hook.tls.depth = 1
            try:
                works = original(p2p_op_list, *args, **kwargs)
            finally:
                hook.tls.depth = 0
            with contextlib.suppress(Exception):
                if messages and works:
                    if len(works) == len(messages):
                        for work, message in zip(works, messages, strict=True):
                            ctx._when_done(work, [message])
                    else:
                        # Coalesced (NCCL): one work completes the whole batch.
                        ctx._when_done(works[-1], messages)
            return works

        return traced


def _peer_args(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(dst or src, group, group_dst or group_src) of a send/recv call after its tensor."""
    name, group_name = ("dst", "group_dst") if op == SEND else ("src", "group_src")
    peer = args[0] if len(args) > 0 else kwargs.get(name)
    group = args[1] if len(args) > 1 else kwargs.get("group")
    group_peer = args[3] if len(args) > 3 else kwargs.get(group_name)
    return peer, group, group_peer


def patch_point_to_point(ctx: HookContext, patches: Patches) -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    p2p = PointToPoint(ctx)
    wrappers = {
        "send": p2p.blocking(c10d.send, SEND),
        "recv": p2p.blocking(c10d.recv, RECV),
        "isend": p2p.asynchronous(c10d.isend, SEND),
        "irecv": p2p.asynchronous(c10d.irecv, RECV),
        "batch_isend_irecv": p2p.batch(c10d.batch_isend_irecv),
    }
    for name, wrapper in wrappers.items():
        original = getattr(c10d, name)
        patches.replace(c10d, name, wrapper, original)
        if getattr(dist, name, None) is original:
            patches.replace(dist, name, wrapper, original)
