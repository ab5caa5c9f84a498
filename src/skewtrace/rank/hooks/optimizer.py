"""``optimizer.step`` spans, and the step boundary: ``train.step`` ends with optimizer.step.

With an optimizer passed to instrument() the hooks go on that instance; without one (and in
zero-code use) on every optimizer through torch's global step hooks. Frameworks hand users
wrappers (Accelerate's ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``,
DeepSpeed's ZeRO optimizers): the hooks go on the torch optimizer inside (``.optimizer``,
``._optimizer``), the one whose step the global hooks would see.

``optimizer.step(closure)`` (Lightning's automatic optimization, LBFGS) runs the forward and
backward inside the step: the span then starts when the closure last returned, so it holds
the update and not the whole step.
"""

from __future__ import annotations

from typing import Any

from skewtrace import semconv
from skewtrace.rank._events import PHASE
from skewtrace.rank._recorder import now_ns
from skewtrace.rank.hooks._context import HookContext
from skewtrace.rank.hooks._patches import Patches

# Where wrappers keep the optimizer they wrap, and how deep to look.
_WRAPPED_ATTRS = ("optimizer", "_optimizer")
_MAX_UNWRAP = 4


def torch_optimizer(optimizer: Any) -> Any:
    """The torch optimizer ``optimizer`` is or wraps; TypeError naming the type if none."""
    from torch.optim import Optimizer

    current = optimizer
    for _ in range(_MAX_UNWRAP + 1):
        # A subclass that never ran Optimizer.__init__ (Accelerate's wrapper) has no hooks.
        if isinstance(current, Optimizer) and hasattr(current, "_optimizer_step_pre_hooks"):
            return current
        inner = next(
            (getattr(current, a) for a in _WRAPPED_ATTRS if getattr(current, a, None) is not None),
            None,
        )
        if inner is None or inner is current:
            break
        current = inner
    raise TypeError(
        f"skewtrace: optimizer= must be a torch.optim.Optimizer or a wrapper holding one in "
        f".optimizer or ._optimizer; got {type(optimizer).__module__}."
        f"{type(optimizer).__qualname__}"
    )


class OptimizerHooks:
    def __init__(self, ctx: HookContext) -> None:
        self._ctx = ctx
        self._start = 0

    def pre_step(self, _optimizer: Any, args: Any, kwargs: Any) -> Any:
        recorder = self._ctx.recorder
        if not recorder.active:
            return None
        self._start = now_ns()
        recorder.mark_activity(self._start)
        # ``args`` is the step's whole argument list, the optimizer first.
        closure = kwargs.get("closure") if kwargs else None
        if closure is None and len(args) > 1:
            closure = args[1]
        if not callable(closure):
            return None

        def timed_closure(*a: Any, **kw: Any) -> Any:
            result = closure(*a, **kw)
            # The update starts after the forward and backward the closure ran.
            self._start = now_ns()
            return result

        if kwargs and "closure" in kwargs:
            return args, {**kwargs, "closure": timed_closure}
        return (args[0], timed_closure, *args[2:]), kwargs

    def post_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        recorder = self._ctx.recorder
        if not recorder.active:
            return
        end = now_ns()
        recorder.record(
            (PHASE, semconv.SPAN_OPTIMIZER_STEP, recorder.step, self._start, end, None, None, None)
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
        optimizer = torch_optimizer(optimizer)
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
