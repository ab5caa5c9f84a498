"""``forward`` spans from hooks on the model (the one passed to instrument(), a DDP model as
it is built, or the one discovered at its first forward), and ``backward`` spans from
``torch.autograd.backward``.

forward: a forward pre-hook and a forward hook on the model, one span per call (per
microbatch under gradient accumulation or pipelining). The pre-hook also reads the call's
input size (``training.input.size``: the elements of the tensors it received, from their
shapes, never their values, so nothing waits for the device), the evidence the Collector
needs to tell sequence lengths that vary per rank and step from a slow rank. backward: the outermost
``torch.autograd.backward`` call (``Tensor.backward`` and pipelining's stage backward call
it), which returns after the autograd engine's final callbacks, where DDP and FSDP wait for
their gradient collectives; one span per backward pass, none for a nested one (reentrant
activation checkpointing). A wrapped function costs one Python frame; a tensor hook on the
model's output and engine callbacks cost several microseconds more per step.

On CUDA the same points record pooled CUDA events instead (``_cuda_timing``), resolved later
by the export thread; host clock reads would measure kernel launches, not work.
"""

from __future__ import annotations

import logging
from typing import Any

from skewtrace import semconv
from skewtrace.rank._events import PHASE
from skewtrace.rank._recorder import now_ns
from skewtrace.rank.hooks._context import HookContext, HookLocal
from skewtrace.rank.hooks._patches import Patches

logger = logging.getLogger("skewtrace")

FORWARD, HOST = semconv.SPAN_FORWARD, semconv.TIMING_HOST


class ModuleHooks:
    def __init__(self, ctx: HookContext, model: Any, use_cuda: bool) -> None:
        self._ctx = ctx
        self._cuda = ctx.cuda_timer if use_cuda else None
        self._forward_start = 0
        self._forward_input: int | None = None
        from torch import Tensor

        self._tensor: Any = Tensor
        self._forward_handle: int | None = None
        # The layer profiler (hooks.layers), told of each forward; None when off.
        self.layer_profiler: Any | None = None
        self._handles = [
            model.register_forward_pre_hook(self._pre_forward, with_kwargs=True),
            model.register_forward_hook(self._post_forward),
        ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _pre_forward(self, _module: Any, args: Any, kwargs: Any = None) -> None:
        ctx = self._ctx
        recorder = ctx.recorder
        if not recorder.active:
            return
        if ctx.pacer is not None:
            ctx.maybe_pace(at_forward=True)
        profiler = self.layer_profiler
        if (
            profiler is not None
            and profiler._layers
            and (profiler._seen_step != recorder.step or profiler._sampled is not None)
        ):
            # Only the first forward of a step, or one in a sampled step, has work there.
            profiler.model_forward()
        self._forward_input = input_size(args, kwargs, self._tensor)
        start = now_ns()
        if recorder.step_start_ns is None:
            recorder.step_start_ns = start  # the first timed event opens the first step
        self._forward_start = start
        if self._cuda is not None:
            if self._forward_handle is not None:
                # The previous forward raised before its post-hook: give its pair back,
                # or the pool loses a slot per failed forward.
                self._cuda.discard(self._forward_handle)
            self._forward_handle = self._cuda.start()

    def _post_forward(self, _module: Any, _args: Any, _output: Any) -> None:
        recorder = self._ctx.recorder
        if not recorder.active:
            return
        handle = self._forward_handle
        if handle is not None:
            self._cuda.stop(handle)  # type: ignore[union-attr]
            self._forward_handle = None
        recorder.record(
            (
                PHASE,
                FORWARD,
                recorder.step,
                self._forward_start,
                now_ns(),
                HOST,
                handle,
                self._forward_input,
            )
        )


_MAX_SAMPLE_ITEMS = 1024
"""The most items :func:`input_size` reads inside the containers of a forward's arguments
(the samples of a batch given as a list of them); past it the size is unknown (None). Each
costs about half a microsecond on the training thread, once per forward."""


def input_size(args: Any, kwargs: Any, tensor: Any) -> int | None:
    """The elements of the tensors a forward call received: its positional and keyword
    arguments, the items of a list, tuple or dict among them, and those items' own items (two
    levels: a batch is a tensor, a few tensors, a dict of them, or a list of samples, each a
    tensor, a tuple or a dict of them, as where each sequence runs at its own length). None
    when it received no tensor, or samples of more than ``_MAX_SAMPLE_ITEMS`` items in all.
    Shapes only: ``numel`` reads no device memory."""
    if not kwargs and len(args) == 1 and isinstance(args[0], tensor):
        return args[0].numel()  # the usual call, model(batch): no loop
    total = 0
    found = False
    budget = _MAX_SAMPLE_ITEMS
    for group in (args, kwargs.values() if kwargs else ()):
        for value in group:
            if isinstance(value, tensor):
                total += value.numel()
                found = True
            elif isinstance(value, (list, tuple, dict)):
                for item in value.values() if isinstance(value, dict) else value:
                    if isinstance(item, tensor):
                        total += item.numel()
                        found = True
                    elif isinstance(item, (list, tuple, dict)):
                        budget -= len(item)
                        if budget < 0:
                            return None
                        for leaf in item.values() if isinstance(item, dict) else item:
                            if isinstance(leaf, tensor):
                                total += leaf.numel()
                                found = True
    return total if found else None


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
        self._tls = HookLocal()
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
        depth = self._tls.depth
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
        self._tls.depth = max(0, self._tls.depth - 1)


def patch_backward(ctx: HookContext, patches: Patches) -> None:
    """A ``backward`` span per outermost ``torch.autograd.backward`` call."""
    import functools

    import torch.autograd

    original = torch.autograd.backward
    recorder = ctx.recorder
    record = recorder.record
    tls = ctx.tls
    span = semconv.SPAN_BACKWARD
    timing = semconv.TIMING_HOST

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if tls.in_backward or not recorder.active:
            return original(*args, **kwargs)
        step = recorder.step
        timer = ctx.cuda_timer
        handle = timer.start() if timer is not None else None
        tls.in_backward = True
        start = now_ns()
        try:
            result = original(*args, **kwargs)
        except BaseException:
            if handle is not None:
                timer.discard(handle)  # type: ignore[union-attr]
            raise
        finally:
            tls.in_backward = False
        if handle is not None:
            timer.stop(handle)  # type: ignore[union-attr]
        record((PHASE, span, step, start, now_ns(), timing, handle, None))
        return result

    patches.replace(torch.autograd, "backward", backward, original)
