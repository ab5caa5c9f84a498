"""``optimizer.step`` spans, and the step boundary: ``train.step`` ends with optimizer.step.

With an optimizer passed to instrument() the hooks go on that instance; without one (and in
zero-code use) on every optimizer through torch's global step hooks.
"""

from __future__ import annotations

from typing import Any

from skewtrace import semconv
from skewtrace._events import PHASE
from skewtrace._recorder import now_ns
from skewtrace.hooks._context import HookContext
from skewtrace.hooks._patches import Patches


class OptimizerHooks:
    def __init__(self, ctx: HookContext) -> None:
        self._ctx = ctx
        self._start = 0

    def pre_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        recorder = self._ctx.recorder
        if not recorder.active:
            return
        self._start = now_ns()
        recorder.mark_activity(self._start)

    def post_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        recorder = self._ctx.recorder
        if not recorder.active:
            return
        end = now_ns()
        recorder.record(
            (PHASE, semconv.SPAN_OPTIMIZER_STEP, recorder.step, self._start, end, None, None)
        )
        recorder.end_step(end)
        groups = self._ctx.process_groups
        if groups is not None:
            # A group created in a way that bypassed our registration hook is hooked from
            # its first full step on.
            groups.attach_existing()


def instrument_optimizer(ctx: HookContext, optimizer: Any | None, patches: Patches) -> None:
    hooks = OptimizerHooks(ctx)
    if optimizer is not None:
        handles = [
            optimizer.register_step_pre_hook(hooks.pre_step),
            optimizer.register_step_post_hook(hooks.post_step),
        ]
    else:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        handles = [
            register_optimizer_step_pre_hook(hooks.pre_step),
            register_optimizer_step_post_hook(hooks.post_step),
        ]

    def remove() -> None:
        for handle in handles:
            handle.remove()

    patches.on_restore(remove)
