"""Where the hooks' time goes: each piece of the training thread's per-call cost, measured by
per-call pairs (issue 49, item 2; docs/performance.md, "Where the hook time goes").

benchmarks/overhead.py times blocks of calls instrumented and bare; on a shared machine a
block's time drifts by microseconds with the load, more than the pieces measured here. So each
figure here is a median over thousands of pairs of single calls, one with the piece installed
and one without, in alternating order, each timed by the training thread's CPU clock
(``time.thread_time_ns``): the load's drift cancels within a pair. The pieces are installed
and removed directly (a process group's hooks, a module's hooks, the ``Work.wait`` and
``torch.autograd.backward`` wrappers), between the timed calls.

Collectives run on PyTorch's fake process group (the real c10d dispatcher and hook path, a
backend that completes at once; an asynchronous work's future is already complete, so the
callback that records its end runs inline and is counted).

    python benchmarks/hook_breakdown.py            # ~1 minute
    python benchmarks/hook_breakdown.py --smoke    # a few pairs: it runs (no target judged)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from _smoke import SMOKE_DONE, SMOKE_HELP  # noqa: E402


def paired(
    call: Callable[[], Any], install: Callable[[], Any], remove: Callable[[Any], None], pairs: int
) -> tuple[float, float, float]:
    """Median added CPU (us) of ``call`` with the piece installed, over ``pairs`` pairs, and its
    ~95% interval (order statistics)."""
    clock = time.thread_time_ns
    diffs: list[int] = []
    for index in range(pairs):
        if index % 2:
            token = install()
            a = clock()
            call()
            b = clock()
            remove(token)
            c = clock()
            call()
            d = clock()
        else:
            c = clock()
            call()
            d = clock()
            token = install()
            a = clock()
            call()
            b = clock()
            remove(token)
        diffs.append((b - a) - (d - c))
    diffs.sort()
    n = len(diffs)
    half = 0.98 * n**0.5
    lo, hi = diffs[max(0, int(n / 2 - half))], diffs[min(n - 1, int(n / 2 + half))]
    return statistics.median(diffs) / 1e3, lo / 1e3, hi / 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument("--pairs", type=int, default=6000)
    args = parser.parse_args()
    pairs = 50 if args.smoke else args.pairs

    import torch
    import torch.autograd
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch import nn
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from skewtrace.rank._recorder import Recorder
    from skewtrace.rank.hooks._context import HookContext
    from skewtrace.rank.hooks._patches import Patches
    from skewtrace.rank.hooks._work import patch_work_wait
    from skewtrace.rank.hooks.module import ModuleHooks, patch_backward
    from skewtrace.rank.hooks.process_group import ProcessGroupHooks

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    pg = dist.group.WORLD
    tensor = torch.ones(1)
    model = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    ctx = HookContext(Recorder(50 * pairs + 16))
    hooks = ProcessGroupHooks(ctx)
    wait_patches = Patches()
    patch_work_wait(ctx.works, wait_patches)  # as instrument() does: every arm has it
    pre, post = hooks._hooks_for(lambda: pg)
    hook_id = 0x5C3E8

    def install_pg(pair: tuple[Any, Any]) -> Callable[[], Any]:
        def install() -> None:
            pg.register_pre_hook(hook_id, pair[0])
            pg.register_post_hook(hook_id, pair[1])

        return install

    def remove_pg(_token: Any) -> None:
        pg.unregister_pre_hook(hook_id)
        pg.unregister_post_hook(hook_id)

    def nothing(_args: Any) -> None:
        return None

    calls = {
        "all_reduce": lambda: dist.all_reduce(tensor),
        "all_reduce_async_wait": lambda: dist.all_reduce(tensor, async_op=True).wait(),
        "functional_all_reduce_wait": lambda: funcol.all_reduce(tensor, "sum", pg).wait(),
    }
    results: dict[str, Any] = {}
    print(f"[a] c10d calling Python: two empty group hooks, median of {pairs} call pairs:")
    for name, call in calls.items():
        for _ in range(20):
            call()
        empty = paired(call, install_pg((nothing, nothing)), remove_pg, pairs)
        results[f"empty_group_hooks_{name}"] = empty
        print(f"    {name:28s} +{empty[0]:5.2f} us [{empty[1]:+.2f}, {empty[2]:+.2f}]")

    # [b] What reading c10d's hook arguments costs, inside a hook (the fastest of 7 loops).
    reads: dict[str, float] = {}

    def loop(label: str, fn: Callable[[Any], Any], value: Any, reps: int) -> None:
        best = float("inf")
        for _ in range(7):
            start = time.thread_time_ns()
            for _ in range(reps):
                fn(value)
            best = min(best, (time.thread_time_ns() - start) / reps)
        reads[label] = best

    reps = 200 if args.smoke else 5000
    from torch._C._distributed_c10d import HookOpName

    by_enum = {member: name for name, member in HookOpName.__members__.items()}
    by_value = {int(member.value): name for name, member in HookOpName.__members__.items()}

    def read_pre(a: Any) -> None:
        loop("(loop)", lambda v: None, a, reps)
        loop("PreHookArgs.name", lambda v: v.name, a, reps)
        loop("op table keyed by the enum: get(.name)", lambda v: by_enum.get(v.name), a, reps)
        loop("keyed by value: get(.name.value)", lambda v: by_value.get(v.name.value), a, reps)
        loop("PreHookArgs.async_op", lambda v: v.async_op, a, reps)
        loop("PreHookArgs.input_tensors", lambda v: v.input_tensors, a, reps)
        loop("input_tensors[0].nbytes", lambda v: v.input_tensors[0].nbytes, a, reps)

    def read_post(a: Any) -> None:
        loop("PostHookArgs.work", lambda v: v.work, a, reps)
        work = a.work
        loop("work.get_future()", lambda v: work.get_future(), a, reps)
        future = work.get_future()
        loop(
            "future.add_done_callback (done future)",
            lambda v: future.add_done_callback(nothing),
            a,
            reps,
        )

    pg.register_pre_hook(hook_id, read_pre)
    pg.register_post_hook(hook_id, read_post)
    dist.all_reduce(tensor, async_op=True).wait()
    remove_pg(None)
    base = reads.pop("(loop)")
    print("[b] reading c10d's hook arguments, inside a hook (fastest of 7 loops):")
    for label, value in reads.items():
        results[f"read {label}"] = value - base
        print(f"    {label:40s} {(value - base) / 1e3:5.2f} us")

    # [c] skewtrace's own hook code, called directly with captured arguments (no c10d call
    # around it), the fastest of 7 loops.
    captured: dict[Any, Any] = {}
    pg.register_pre_hook(hook_id, lambda a: captured.setdefault(("pre", a.async_op), a))
    pg.register_post_hook(hook_id, lambda a: captured.setdefault(("post", a.async_op), a))
    dist.all_reduce(tensor)
    dist.all_reduce(tensor, async_op=True).wait()
    remove_pg(None)
    sync_work = captured[("post", False)].work

    def direct(label: str, fn: Callable[[], Any]) -> float:
        best = float("inf")
        for _ in range(7):
            start = time.thread_time_ns()
            for _ in range(reps):
                fn()
            best = min(best, (time.thread_time_ns() - start) / reps)
        ctx.recorder.events.clear()
        return best

    empty_loop = direct("", lambda: None)

    def sync_hooks() -> None:
        pre(captured[("pre", False)])
        post(captured[("post", False)])
        sync_work.wait()

    def async_hooks() -> None:
        pre(captured[("pre", True)])
        post(captured[("post", True)])

    out = model(x)
    module_hooks = ModuleHooks(ctx, model, use_cuda=False)
    module_hooks.remove()

    def forward_hooks() -> None:
        module_hooks._pre_forward(model, (x,), {})
        module_hooks._post_forward(model, (x,), out)

    def fake_backward(*_a: Any, **_k: Any) -> None:
        return None

    original = torch.autograd.backward
    torch.autograd.backward = fake_backward
    backward_patches = Patches()
    patch_backward(ctx, backward_patches)
    wrapped_backward = torch.autograd.backward
    backward_patches.restore()
    torch.autograd.backward = original
    own = {
        "sync collective: pre + post + Work.wait": direct("", sync_hooks) - empty_loop,
        "async collective: pre + post (future callback inline)": direct("", async_hooks)
        - empty_loop,
        "forward: pre + post": direct("", forward_hooks) - empty_loop,
        "backward wrapper (around a no-op backward)": direct("", lambda: wrapped_backward(tensor))
        - direct("", lambda: fake_backward(tensor)),
    }
    print("[c] skewtrace's hook code called directly with captured arguments (fastest of 7):")
    for label, value in own.items():
        results[f"own {label}"] = value
        print(f"    {label:55s} {value / 1e3:5.2f} us")

    # [d] Module hooks: Module.__call__'s slow path, taken once a module has any hook.
    def install_empty_module_hooks() -> Any:
        return (
            model.register_forward_pre_hook(lambda m, a, k: None, with_kwargs=True),
            model.register_forward_hook(lambda m, a, o: None),
        )

    def remove_handles(handles: Any) -> None:
        for handle in handles:
            handle.remove()

    for _ in range(20):
        model(x)
    empty_fwd = paired(lambda: model(x), install_empty_module_hooks, remove_handles, pairs)
    results["empty_module_hooks_forward"] = empty_fwd
    print(
        f"[d] forward of an nn.Linear with two empty module hooks (Module.__call__'s slow path),"
        f" median of {pairs} pairs: +{empty_fwd[0]:5.2f} us [{empty_fwd[1]:+.2f}, "
        f"{empty_fwd[2]:+.2f}]"
    )

    def passthrough(*a: Any, **k: Any) -> Any:
        return original(*a, **k)

    def swap(function: Any) -> Callable[[], None]:
        def install() -> None:
            torch.autograd.backward = function

        return install

    def restore_backward(_token: Any) -> None:
        torch.autograd.backward = original

    backward_patches = Patches()
    patch_backward(ctx, backward_patches)
    ours_backward = torch.autograd.backward
    backward_patches.restore()
    backward = lambda: model(x).sum().backward()  # noqa: E731
    pass_bwd = paired(backward, swap(passthrough), restore_backward, pairs)
    ours_bwd = paired(backward, swap(ours_backward), restore_backward, pairs)
    ctx.recorder.events.clear()
    results["backward_passthrough"] = pass_bwd
    results["backward_skewtrace"] = ours_bwd
    print(
        f"[e] backward, median of {pairs} pairs: a pass-through wrapper of "
        f"torch.autograd.backward +{pass_bwd[0]:5.2f} us [{pass_bwd[1]:+.2f}, "
        f"{pass_bwd[2]:+.2f}]; skewtrace's +{ours_bwd[0]:5.2f} us [{ours_bwd[1]:+.2f}, "
        f"{ours_bwd[2]:+.2f}]"
    )
    dist.destroy_process_group()
    print("SUMMARY " + json.dumps(results))
    if args.smoke:
        print(SMOKE_DONE)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("SKEWTRACE_NODE_TELEMETRY", "false")
    sys.exit(main())
