"""``pipeline.layers``: the forward and backward time of each layer of a pipeline stage's
model, one step in ``layer_profile_every`` (``SKEWTRACE_LAYER_PROFILE_EVERY``, 50 by default).

The layers are the model's child modules (descending while a module has exactly one child:
a stage that wraps an ``nn.Sequential`` profiles the Sequential's layers). A rank profiles
only once it has sent or received a point-to-point message (a pipeline stage), and only on
steps ``k * every`` (k >= 1).

Cost. At each forward of the model (from the instrumentation's own pre-hook on it), on steps
that are not sampled, it compares the step with the last one it saw and returns. On a
sampled step, at the model's first forward, it installs a forward pre-hook and a forward
hook on every layer; they take the clock around each layer's forward and put a gradient hook
on the layer's first input and output tensor that need one: the output's gradient arriving
is where the layer's backward starts, its input's where it ends (for the first layer of
stage 0, whose input needs no gradient, the end of the backward pass, through an engine
callback). Times are summed over the step's micro-batches. At the next step's first forward
(or at uninstrument) the sums are recorded as one event and the layer hooks removed. On CUDA
each clock read of a sampled step follows a ``torch.cuda.synchronize()``: host clocks would
measure launches otherwise; unsampled steps never synchronize.
``benchmarks/layer_profile.py`` measures both.

Gradient hooks on tensors, not ``register_full_backward_hook``: full backward hooks wrap the
module's outputs in a custom autograd Function, and an in-place op on them (``ReLU(inplace=
True)`` after a ``Linear``) then raises; a tensor hook changes nothing in the graph.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from skewtrace.rank._events import LAYERS
from skewtrace.rank._recorder import now_ns
from skewtrace.rank.hooks._context import HookContext
from skewtrace.rank.hooks._patches import Patches

logger = logging.getLogger("skewtrace")


def layers_of(model: Any) -> list[tuple[str, Any]]:
    """The model's layers: its named children, descending while there is exactly one and it
    holds the layers (a container: ``nn.Sequential``, ``ModuleList``, ``ModuleDict``; or a
    wrapper's module of several children, as DDP's). A container of one layer is that layer
    (a stage holding only its head profiles the head, not the head's parts)."""
    from torch import nn

    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    prefix, module = "", model
    while True:
        children = list(module.named_children())
        if len(children) != 1:
            return [(prefix + name, child) for name, child in children]
        name, child = children[0]
        if not isinstance(child, containers) and (
            isinstance(module, containers) or len(list(child.children())) < 2
        ):
            return [(prefix + name, child)]
        module, prefix = child, f"{prefix}{name}."


def _first_grad_tensor(value: Any, tensor: Any) -> Any:
    """The first tensor that requires a gradient in value (a tensor, or a tuple, list or
    dict of them, one level deep)."""
    if isinstance(value, tensor):
        return value if value.requires_grad else None
    items = value.values() if isinstance(value, dict) else value
    if isinstance(value, (tuple, list, dict)):
        for item in items:
            if isinstance(item, tensor) and item.requires_grad:
                return item
    return None


class LayerProfiler:
    """``model_forward`` is called at each forward of the model: by ``ModuleHooks``' own
    pre-hook when the instrumentation installs it (no second hook on the model), else
    (``own_hook``, tests and benchmarks) by a pre-hook of its own."""

    def __init__(
        self, ctx: HookContext, model: Any, every: int, use_cuda: bool, own_hook: bool = True
    ) -> None:
        import torch

        self._ctx = ctx
        self._every = every
        self._torch = torch
        self._tensor = torch.Tensor
        self._sync = torch.cuda.synchronize if use_cuda else None
        self._layers = layers_of(model)
        self._seen_step = -1
        self._sampled: int | None = None
        self._layer_handles: list[Any] = []
        self._reset()
        self._handles = (
            [model.register_forward_pre_hook(self._model_forward)]
            if own_hook and len(self._layers)
            else []
        )

    def _reset(self) -> None:
        n = len(self._layers)
        self._forward = [0.0] * n
        self._backward = [0.0] * n
        self._starts: list[list[float]] = [[] for _ in range(n)]
        self._calls = 0
        self._first_ns = 0
        self._open: dict[int, float] = {}
        self._input_needs_grad = False

    def _clock(self) -> float:
        if self._sync is not None:
            self._sync()
        return time.perf_counter()

    # -- at each forward of the model: cheap unless the step is to be sampled -------------
    def _model_forward(self, _module: Any, _args: Any) -> None:
        self.model_forward()

    def model_forward(self) -> None:
        if not self._layers:
            return
        step = self._ctx.recorder.step
        if step == self._seen_step:
            if self._sampled is not None:
                self._calls += 1
            return
        self._seen_step = step
        try:
            if self._sampled is not None:
                self._finish()
            if step > 0 and step % self._every == 0 and self._ctx.p2p_seen:
                self._start(step)
        except Exception:
            logger.debug("skewtrace: layer profile failed", exc_info=True)
            self._remove_layer_hooks()
            self._sampled = None

    def _start(self, step: int) -> None:
        self._reset()
        self._sampled = step
        self._calls = 1
        self._first_ns = now_ns()
        for i, (_, layer) in enumerate(self._layers):
            self._layer_handles.append(layer.register_forward_pre_hook(self._pre(i)))
            self._layer_handles.append(layer.register_forward_hook(self._post(i)))

    def _pre(self, i: int) -> Any:
        def pre(_module: Any, args: Any) -> None:
            self._starts[i].append(self._clock())
            inp = _first_grad_tensor(args, self._tensor)
            if inp is not None:
                inp.register_hook(self._input_grad(i))

        return pre

    def _post(self, i: int) -> Any:
        def post(_module: Any, _args: Any, output: Any) -> None:
            end = self._clock()
            starts = self._starts[i]
            if starts:
                self._forward[i] += end - starts.pop()
            out = _first_grad_tensor(output, self._tensor)
            if out is not None:
                out.register_hook(self._output_grad(i))

        return post

    # Backward: the output's gradient opens layer i's backward, its input's closes it. One
    # open start per layer and micro-batch, closed in order (a layer's micro-batches go
    # backward in the order their gradients arrive, one at a time on this stage).
    def _output_grad(self, i: int) -> Any:
        def hook(_grad: Any) -> None:
            start = self._clock()
            self._open[i] = start
            if i == 0 and not self._input_needs_grad:
                self._torch.autograd.Variable._execution_engine.queue_callback(self._close(0))

        return hook

    def _input_grad(self, i: int) -> Any:
        self._input_needs_grad = self._input_needs_grad or i == 0

        def hook(_grad: Any) -> None:
            self._close(i)()

        return hook

    def _close(self, i: int) -> Any:
        def close() -> None:
            start = self._open.pop(i, None)
            if start is not None:
                self._backward[i] += self._clock() - start

        return close

    def _finish(self) -> None:
        step, self._sampled = self._sampled, None
        self._remove_layer_hooks()
        if step is None or not self._calls:
            return
        self._ctx.recorder.record(
            (
                LAYERS,
                step,
                self._first_ns,
                now_ns(),
                tuple(name for name, _ in self._layers),
                tuple(self._forward),
                tuple(self._backward),
                self._calls,
            )
        )

    def _remove_layer_hooks(self) -> None:
        for handle in self._layer_handles:
            handle.remove()
        self._layer_handles = []

    def remove(self) -> None:
        try:
            if self._sampled is not None:
                self._finish()
        finally:
            self._remove_layer_hooks()
            for handle in self._handles:
                handle.remove()
            self._handles = []


def install_layer_profiler(
    ctx: HookContext, hooks: Any, model: Any, every: int, use_cuda: bool, patches: Patches
) -> LayerProfiler | None:
    """Profiles ``model``'s layers, called from ``hooks`` (its ``ModuleHooks``)."""
    if every <= 0:
        return None
    profiler = LayerProfiler(ctx, model, every, use_cuda, own_hook=False)
    hooks.layer_profiler = profiler

    def remove() -> None:
        hooks.layer_profiler = None
        profiler.remove()

    patches.on_restore(remove)
    return profiler
