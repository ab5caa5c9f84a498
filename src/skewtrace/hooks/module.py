"""``forward`` and ``backward`` spans from hooks on the model passed to instrument().

forward: a forward pre-hook and a forward hook. backward: starts when autograd computes the
gradient of the model's output (a tensor hook placed by the forward hook) and ends after the
autograd engine's final callbacks, which is where DDP waits for its gradient all-reduces; our
end callback is queued from inside the first so it runs after DDP's.

On CUDA the same points record pooled CUDA events instead (``_cuda_timing``), resolved later
by the export thread; host clock reads would measure kernel launches, not work.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from skewtrace import semconv
from skewtrace._events import PHASE
from skewtrace._recorder import now_ns
from skewtrace.hooks._context import HookContext
from skewtrace.hooks._patches import Patches

logger = logging.getLogger("skewtrace")


def _first_grad_tensor(output: Any) -> Any:
    import torch

    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        for item in output:
            found = _first_grad_tensor(item)
            if found is not None:
                return found
    return None


class ModuleHooks:
    def __init__(self, ctx: HookContext, model: Any, use_cuda: bool) -> None:
        self._ctx = ctx
        self._cuda = ctx.cuda_timer if use_cuda else None
        self._forward_start = 0
        self._forward_handle: int | None = None
        self._backward_step = -1
        self._backward_open = False
        self._backward_start = 0
        self._backward_handle: int | None = None
        self._handles = [
            model.register_forward_pre_hook(self._pre_forward),
            model.register_forward_hook(self._post_forward),
        ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _pre_forward(self, _module: Any, _args: Any) -> None:
        recorder = self._ctx.recorder
        if not recorder.active:
            return
        self._ctx.maybe_pace(at_forward=True)
        start = now_ns()
        recorder.mark_activity(start)
        self._forward_start = start
        if self._cuda is not None:
            if self._forward_handle is not None:
                # The previous forward raised before its post-hook: give its pair back,
                # or the pool loses a slot per failed forward.
                self._cuda.discard(self._forward_handle)
            self._forward_handle = self._cuda.start()

    def _post_forward(self, _module: Any, _args: Any, output: Any) -> None:
        recorder = self._ctx.recorder
        if not recorder.active:
            return
        handle = self._forward_handle
        if handle is not None:
            self._cuda.stop(handle)  # type: ignore[union-attr]
            self._forward_handle = None
        end = now_ns()
        recorder.record(
            (
                PHASE,
                semconv.SPAN_FORWARD,
                recorder.step,
                self._forward_start,
                end,
                semconv.TIMING_HOST,
                handle,
            )
        )
        try:
            tensor = _first_grad_tensor(output)
            if tensor is not None:
                tensor.register_hook(self._on_output_grad)
        except Exception:
            logger.debug("skewtrace: backward not traced", exc_info=True)

    def _on_output_grad(self, _grad: Any) -> None:
        # One span per backward pass: per microbatch under gradient accumulation or
        # pipelining, and none nested (a recomputation inside backward).
        recorder = self._ctx.recorder
        if not recorder.active or self._backward_open:
            return
        self._backward_open = True
        self._backward_step = recorder.step
        self._backward_start = now_ns()
        if self._cuda is not None:
            self._backward_handle = self._cuda.start()
        from torch.autograd import Variable

        Variable._execution_engine.queue_callback(self._queue_end)

    def _queue_end(self) -> None:
        from torch.autograd import Variable

        Variable._execution_engine.queue_callback(self._end_backward)

    def _end_backward(self) -> None:
        recorder = self._ctx.recorder
        self._backward_open = False
        handle = self._backward_handle
        if handle is not None:
            self._cuda.stop(handle)  # type: ignore[union-attr]
            self._backward_handle = None
        recorder.record(
            (
                PHASE,
                semconv.SPAN_BACKWARD,
                self._backward_step,
                self._backward_start,
                now_ns(),
                semconv.TIMING_HOST,
                handle,
            )
        )


def instrument_module(
    ctx: HookContext, model: Any, use_cuda: bool, patches: Patches
) -> ModuleHooks:
    hooks = ModuleHooks(ctx, model, use_cuda)
    ctx.pace_before_forward = True
    patches.on_restore(hooks.remove)
    return hooks


class ModelDiscovery:
    """Zero-code without DDP: the model is the first module whose forward is entered while
    no other module's forward runs (on this thread) and that has parameters: an FSDP2 root,
    a tensor-parallel model, a pipeline stage's submodule, a plain ``nn.Module``. A loss
    module (no parameters) is passed over. Global module hooks do the watching and are
    removed once a model is adopted, so after the first forward no module pays for them.

    ``adopt(module)`` instruments the module and returns its hooks; the forward under way is
    timed from here, as its own pre-hook would have.
    """

    def __init__(self, ctx: HookContext, adopt: Any) -> None:
        from torch.nn.modules import module as nn_module

        self._ctx = ctx
        self._adopt = adopt
        self._tls = threading.local()
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._pre_forward),
            nn_module.register_module_forward_hook(self._post_forward, always_call=True),
        ]

    @property
    def watching(self) -> bool:
        return bool(self._handles)

    def stop(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _pre_forward(self, module: Any, args: Any) -> None:
        depth = getattr(self._tls, "depth", 0)
        self._tls.depth = depth + 1
        if depth or not self._handles or not self._ctx.recorder.active:
            return
        try:
            if next(module.parameters(), None) is None:
                return
            self.stop()
            hooks = self._adopt(module)
            if hooks is not None:
                hooks._pre_forward(module, args)
        except Exception:
            logger.warning("skewtrace: could not instrument the model", exc_info=True)

    def _post_forward(self, _module: Any, _args: Any, _output: Any) -> None:
        self._tls.depth = max(0, getattr(self._tls, "depth", 0) - 1)
