"""A 2D-parallel training job (pipeline x data parallel), instrumented by skewtrace.

The ranks form ``--pp`` pipeline stages of ``dp = world / pp`` data-parallel replicas each:
rank ``r`` is stage ``r // dp``, replica ``r % dp`` (a stage's replicas are consecutive
ranks, which a fabric places on one leaf switch). Per step, on every rank:

1. fetch a batch (every stage of a replica reads the same one; the first stage uses the
   inputs, the last the targets);
2. forward: receive the activations from the previous stage (``recv``), run the local stage,
   send the result to the next stage (``send``);
3. backward: receive the gradient of the output from the next stage (``recv``), run real
   autograd on the local stage (``out.backward(grad)``; the last stage computes the loss),
   then send the gradient of the input to the previous stage (``send``; ``--p2p async``
   uses ``isend``/``irecv`` and waits for them instead). The stage's
   gradients are averaged over its replicas: by DDP during backward (``--grad-sync ddp``,
   the default), or by one blocking ``all_reduce`` after the send (``--grad-sync
   allreduce``);
4. all-reduce the step's loss over the world (logging), then the optimizer step.

Groups: one data-parallel group per stage (``dist.new_group``, created on every rank in the
same order), pipeline messages on the world group between consecutive stages of one
replica, and the world for the loss. One microbatch per step: the stages of a replica take
turns, and the replicas run side by side.

Launch one process per rank with torchrun's variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), e.g. ``torchrun --nproc-per-node 6
examples/train_2d.py``, or by itself: ``python examples/train_2d.py --nprocs 6`` spawns the
ranks. CPU and gloo only. Spans go to ``OTEL_EXPORTER_OTLP_ENDPOINT``; the job id is
``--job-id``, else ``SKEWTRACE_JOB_ID`` / ``TORCHELASTIC_RUN_ID``, else made up by rank 0;
with ``SKEWTRACE_PACER_URL`` set, skewtrace applies the pacer's delays.

Size: ``--activation-bytes`` (the size of each pipeline message: the activations are
shaped to it), ``--hidden`` and ``--layers`` (each stage's width and depth, and with them
the gradient bytes all-reduced per stage), ``--batch-size``. Faults (``--straggler``,
``--jitter``, ``--slow-rank``, with step windows ``@START:END``) are described in
``examples/_faults.py``. ``--read-file PATH`` makes every batch also read ``--read-bytes``
from that file or block device with ``O_DIRECT`` (real storage in the data loader's fetch).

``--progress-file PATH``: rank 0 appends ``{"step": n, "t": <unix time>}`` per finished step
(n counts from 0, as the spans' ``training.step``), flushed at once, so a program outside the
job can follow it. At the end every rank prints one JSON line ``{"event": "step_stats",
"rank": .., "stage": .., "replica": .., "step_time_mean_s": .., "step_time_cv": ..,
"throughput_samples_s": .., ...}`` over the steps after ``--warmup``, with every step's time
in ``step_times_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from _faults import (
    DirectReader,
    RankFaults,
    SlowCollate,
    busy_compute,
    check_ranks,
    parse_jitter,
    parse_slow_rank,
    parse_straggler,
)

FEATURES = 64
CLASSES = 10
FLOAT_BYTES = 4
_SPAWNED = "_TRAIN_2D_SPAWNED"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Fault forms: see examples/_faults.py. Windows: @START:END or @START: (to the end).",
    )
    parser.add_argument(
        "--nprocs", type=int, default=6, help="ranks to spawn when not launched (default 6)"
    )
    parser.add_argument("--pp", type=int, default=3, help="pipeline stages (default 3)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the stats")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--hidden", type=int, default=256, help="stage width (DDP's all-reduce bytes scale with it)"
    )
    parser.add_argument("--layers", type=int, default=3, help="linear layers per stage")
    parser.add_argument(
        "--activation-bytes",
        type=int,
        default=256 * 1024,
        help="bytes of each pipeline message (default 256 KiB)",
    )
    parser.add_argument(
        "--straggler",
        type=parse_straggler,
        action="append",
        default=[],
        metavar="RANK:KIND:AMOUNT[@START:END]",
        help="KIND compute|data|sleep, AMOUNT seconds per step (repeatable)",
    )
    parser.add_argument(
        "--jitter",
        type=parse_jitter,
        action="append",
        default=[],
        metavar="RANKS:AMOUNT[@START:END]",
        help="uniform 0..AMOUNT s of busy compute per step on RANKS, e.g. 1,3:0.03",
    )
    parser.add_argument(
        "--slow-rank",
        type=parse_slow_rank,
        action="append",
        default=[],
        metavar="RANK:FACTOR",
        help="the rank computes FACTOR times slower for the whole run (2.0: half speed)",
    )
    parser.add_argument(
        "--grad-sync",
        choices=("ddp", "allreduce"),
        default="ddp",
        help="ddp: DistributedDataParallel over the stage's group, all-reducing gradient "
        "buckets during backward (default); allreduce: one blocking all_reduce of the "
        "flattened gradients after the stage sent its input gradient back",
    )
    parser.add_argument(
        "--p2p",
        choices=("blocking", "async"),
        default="blocking",
        help="pipeline messages by send/recv (default) or by isend/irecv and wait()",
    )
    parser.add_argument(
        "--read-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="read --read-bytes from this file or block device per batch, with O_DIRECT "
        "(real storage in the data loader's fetch)",
    )
    parser.add_argument("--read-bytes", type=int, default=256 * 1024, metavar="N")
    parser.add_argument("--progress-file", type=Path, default=None, metavar="PATH")
    parser.add_argument("--no-instrument", action="store_true", help="baseline: no skewtrace")
    parser.add_argument("--job-id", default=None, help="default: SKEWTRACE_JOB_ID or generated")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def parse_args(argv: list[str] | None, world: int) -> argparse.Namespace:
    """Arguments checked against the job's world size (usage errors exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, value, low in (
        ("--pp", args.pp, 1),
        ("--steps", args.steps, 1),
        ("--batch-size", args.batch_size, 1),
        ("--hidden", args.hidden, 1),
        ("--layers", args.layers, 1),
        ("--activation-bytes", args.activation_bytes, FLOAT_BYTES),
        ("--warmup", args.warmup, 0),
    ):
        if value < low:
            parser.error(f"{flag} must be >= {low}, got {value}")
    if world % args.pp:
        parser.error(f"--pp {args.pp} does not divide the world size {world}")
    check_ranks(parser, world, args.straggler, args.jitter, args.slow_rank)
    return args


@dataclass(frozen=True)
class Layout:
    """Where a rank sits in the 2D grid."""

    rank: int
    world: int
    pp: int

    @property
    def dp(self) -> int:
        return self.world // self.pp

    @property
    def stage(self) -> int:
        return self.rank // self.dp

    @property
    def replica(self) -> int:
        return self.rank % self.dp

    def stage_ranks(self, stage: int) -> list[int]:
        return list(range(stage * self.dp, (stage + 1) * self.dp))

    @property
    def prev(self) -> int | None:
        """The same replica's rank in the previous stage."""
        return self.rank - self.dp if self.stage > 0 else None

    @property
    def next(self) -> int | None:
        return self.rank + self.dp if self.stage < self.pp - 1 else None


class SyntheticDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(size, FEATURES, generator=generator)
        self.targets = torch.randint(0, CLASSES, (size,), generator=generator)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


class _GradPoint(torch.autograd.Function):
    """The identity; its backward calls ``callback`` when the gradient passes this point."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, callback: Callable[[], None]) -> torch.Tensor:
        ctx.callback = callback
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.callback()
        return grad, None


class Stage(nn.Module):
    """One pipeline stage: an MLP from ``in_width`` to ``out_width``, plus the faults' extra
    compute inside its forward and (for ``--slow-rank``) its backward."""

    def __init__(
        self, in_width: int, hidden: int, out_width: int, layers: int, slow_factor: float
    ) -> None:
        super().__init__()
        widths = [in_width] + [hidden] * (layers - 1) + [out_width]
        blocks: list[nn.Module] = []
        for i in range(layers):
            blocks.append(nn.Linear(widths[i], widths[i + 1]))
            if i < layers - 1:
                blocks.append(nn.ReLU())
        self.body = nn.Sequential(*blocks)
        self.slow_factor = slow_factor
        # Set per step by the training loop: the compute straggler's and jitter's seconds.
        self.extra_compute_s = 0.0
        self._backward_start = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        busy_compute(self.extra_compute_s, x.device)
        if self.slow_factor == 1.0:
            return self.body(x)  # type: ignore[no-any-return]
        if not x.requires_grad:
            # The first stage's inputs: the backward must reach the input to be timed.
            x = x.detach().requires_grad_()
        x = _GradPoint.apply(x, self._backward_done)
        start = time.perf_counter()
        y = self.body(x)
        busy_compute((time.perf_counter() - start) * (self.slow_factor - 1), x.device)
        return _GradPoint.apply(y, self._backward_begins)  # type: ignore[no-any-return]

    def _backward_begins(self) -> None:
        self._backward_start = time.perf_counter()

    def _backward_done(self) -> None:
        own = time.perf_counter() - self._backward_start
        busy_compute(own * (self.slow_factor - 1), torch.device("cpu"))


def _send(tensor: torch.Tensor, peer: int | None) -> None:
    dist.send(tensor, dst=peer)


def _recv(tensor: torch.Tensor, peer: int | None) -> None:
    dist.recv(tensor, src=peer)


def _isend_wait(tensor: torch.Tensor, peer: int | None) -> None:
    work = dist.isend(tensor, dst=peer)
    assert work is not None
    work.wait()


def _irecv_wait(tensor: torch.Tensor, peer: int | None) -> None:
    work = dist.irecv(tensor, src=peer)
    assert work is not None
    work.wait()


def all_reduce_gradients(module: nn.Module, group: Any, size: int) -> None:
    """Average the gradients over ``group`` in one blocking all_reduce."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat.div_(size)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def agreed_job_id(job_id: str | None) -> str:
    """The given id, else one rank 0 makes up and broadcasts (torchrun without --rdzv-id
    gives every job the run id "none", which skewtrace refuses)."""
    if job_id and job_id != "none":
        return job_id
    proposal = [f"train-2d-{uuid.uuid4().hex[:8]}" if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(proposal, src=0)
    return str(proposal[0])


def train(args: argparse.Namespace) -> dict[str, Any]:
    layout = Layout(dist.get_rank(), dist.get_world_size(), args.pp)
    first, last = layout.stage == 0, layout.stage == args.pp - 1
    # Ranks share the CPUs: one thread each avoids oversubscription noise.
    torch.set_num_threads(1)
    random.seed(args.seed)
    # Replicas of a stage start from the same weights (DDP also broadcasts them).
    torch.manual_seed(args.seed * 1000 + layout.stage)
    faults = RankFaults(layout.rank, args.straggler, args.jitter, args.slow_rank, args.seed)

    # Every rank creates every stage's group, in the same order; it keeps its own.
    stage_groups = [dist.new_group(layout.stage_ranks(s)) for s in range(args.pp)]
    group = stage_groups[layout.stage]
    assert isinstance(group, dist.ProcessGroup)

    act_width = max(1, args.activation_bytes // (FLOAT_BYTES * args.batch_size))
    stage = Stage(
        FEATURES if first else act_width,
        args.hidden,
        CLASSES if last else act_width,
        args.layers,
        faults.slow_factor,
    )
    model: nn.Module = stage
    if args.grad_sync == "ddp":
        model = DistributedDataParallel(stage, process_group=group)
    else:
        # What DDP's constructor does: every replica starts from the same weights.
        for param in stage.parameters():
            dist.broadcast(param.data, src=layout.stage_ranks(layout.stage)[0], group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    dataset = SyntheticDataset(args.batch_size * args.steps * layout.dp, args.seed)
    # Every stage of a replica reads the same batches.
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=layout.dp, rank=layout.replica, seed=args.seed
    )
    collate = SlowCollate(
        DirectReader(args.read_file, args.read_bytes) if args.read_file is not None else None
    )
    loader = DataLoader(
        dataset, batch_size=args.batch_size, sampler=sampler, collate_fn=collate, drop_last=True
    )

    job_id = agreed_job_id(args.job_id)
    if not args.no_instrument:
        import skewtrace

        skewtrace.instrument(model=model, optimizer=optimizer, dataloader=loader, job_id=job_id)

    progress = None
    if args.progress_file is not None and layout.rank == 0:
        progress = args.progress_file.open("a", encoding="utf-8")

    send, recv = (_send, _recv) if args.p2p == "blocking" else (_isend_wait, _irecv_wait)
    step_times: list[float] = []
    batches = iter(loader)
    reported = torch.zeros(1)
    last_t = time.perf_counter()
    try:
        for step in range(args.steps):
            collate.delay_s = faults.data_s(step)
            inputs, targets = next(batches)
            stage.extra_compute_s = faults.compute_s(step)
            optimizer.zero_grad(set_to_none=True)

            if first:
                x = inputs
            else:
                x = torch.empty(args.batch_size, act_width)
                recv(x, layout.prev)
                x.requires_grad_()
            out = model(x)
            if last:
                loss = loss_fn(out, targets)
                loss.backward()
                reported = loss.detach().reshape(1)
            else:
                send(out.detach(), layout.next)
                grad = torch.empty_like(out)
                recv(grad, layout.next)
                out.backward(grad)
                reported = torch.zeros(1)
            if not first:
                assert x.grad is not None
                send(x.grad, layout.prev)
            if args.grad_sync == "allreduce":
                all_reduce_gradients(stage, group, layout.dp)

            # The step's loss for logging, over the world (only last stages contribute).
            dist.all_reduce(reported)
            optimizer.step()
            sleep_s = faults.sleep_s(step)
            if sleep_s > 0:
                time.sleep(sleep_s)

            now = time.perf_counter()
            step_times.append(now - last_t)
            last_t = now
            if progress is not None:
                progress.write(json.dumps({"step": step, "t": time.time()}) + "\n")
                progress.flush()
    finally:
        if progress is not None:
            progress.close()

    if not args.no_instrument:
        import skewtrace

        skewtrace.uninstrument()
    measured = step_times[args.warmup :] or step_times
    mean = statistics.fmean(measured)
    stdev = statistics.pstdev(measured) if len(measured) > 1 else 0.0
    return {
        "event": "step_stats",
        "rank": layout.rank,
        "stage": layout.stage,
        "replica": layout.replica,
        "world_size": layout.world,
        "pp": layout.pp,
        "dp": layout.dp,
        "steps": len(step_times),
        "measured_steps": len(measured),
        "step_time_mean_s": mean,
        "step_time_cv": stdev / mean if mean > 0 else 0.0,
        "step_time_median_s": statistics.median(measured),
        "step_times_s": [round(t, 5) for t in step_times],
        "throughput_samples_s": args.batch_size * layout.dp / mean if mean > 0 else 0.0,
        "activation_bytes": act_width * args.batch_size * FLOAT_BYTES,
        "grad_bytes": sum(p.numel() * p.element_size() for p in stage.parameters()),
        "grad_sync": args.grad_sync,
        "p2p": args.p2p,
        "instrumented": not args.no_instrument,
        "job_id": job_id,
        "final_loss": float(reported.item()) / layout.dp,
    }


def worker(local_rank: int, args: argparse.Namespace, world: int) -> None:
    if os.environ.get(_SPAWNED) == "1":
        os.environ["RANK"] = str(local_rank)
        os.environ["LOCAL_RANK"] = str(local_rank)
        os.environ["WORLD_SIZE"] = str(world)
    dist.init_process_group("gloo")
    try:
        stats = train(args)
        # One write per line: the ranks share the launcher's stdout.
        sys.stdout.write(json.dumps(stats) + "\n")
        sys.stdout.flush()
        # Every rank is done with the group before any tears it down (gloo can abort a rank
        # whose peer destroys its group first).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if launched:
        world = int(os.environ["WORLD_SIZE"])
    else:
        nprocs = build_parser().parse_known_args(argv)[0].nprocs
        if nprocs < 1:
            build_parser().error(f"--nprocs must be >= 1, got {nprocs}")
        world = nprocs
    args = parse_args(argv, world)
    if args.job_id is None:
        args.job_id = os.environ.get("SKEWTRACE_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID")
    if launched:
        worker(int(os.environ.get("LOCAL_RANK", os.environ["RANK"])), args, world)
        return 0
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ[_SPAWNED] = "1"
    if args.job_id is None:
        args.job_id = f"train-2d-{uuid.uuid4().hex[:8]}"
    os.environ["SKEWTRACE_JOB_ID"] = args.job_id
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(args, world), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
