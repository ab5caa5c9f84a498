"""A small DDP training job, instrumented by skewtrace: the reference workload.

Launch with torchrun (``torchrun --nproc-per-node 4 examples/train_ddp.py``) or by itself
(``python examples/train_ddp.py --nprocs 4``: spawns the ranks, sets MASTER_ADDR/PORT and a
shared SKEWTRACE_JOB_ID). CPU/gloo by default; CUDA/NCCL when every rank has a GPU.
Spans go to ``OTEL_EXPORTER_OTLP_ENDPOINT`` (default localhost:4317) like any OTel program.

Knobs to make a rank late on purpose:

- ``--straggler RANK:KIND:AMOUNT`` (repeatable). KIND ``compute``: AMOUNT seconds of extra
  busy compute inside that rank's forward; ``data``: the rank's loader waits AMOUNT seconds
  per batch; ``sleep``: a sleep of AMOUNT seconds outside the traced phases.
- ``--jitter RANKS:AMOUNT`` (e.g. ``1,3:0.03``): a uniform 0..AMOUNT s sleep per step inside
  forward on those ranks; ``--jitter-steps START:END`` limits it to steps [START, END).
- ``--dynamic-batch MIN:MAX``: every rank trains on a batch of MIN..MAX samples (drawn per
  rank and step), as jobs with variable sequence lengths or dynamic batching do; with
  ``--sample-time SECONDS`` its forward also takes that long per sample (a sleep: time on a
  simulated accelerator, so that two shared CPUs do not decide it). No rank is slow, yet a
  different one is slowest in each step: a data imbalance.
- ``--sets S``: the ranks form S sets (rank r in set r mod S: with a rank per node, nodes of
  alternating parity, as the halves or stages of a larger job), each with a data-parallel
  group of its own (DDP over that group); the step's loss all-reduce over the world keeps
  the sets in one step. ``--gather-bytes N``: every forward starts with a blocking gather of
  N bytes a rank over its data-parallel group (a ZeRO-3/FSDP parameter gather), in
  all-gathers of at most 256 KiB one after the other, as FSDP gathers unit by unit (one gloo
  all-gather of 3.3 MB on the fabric took 100 ms where the link carries it in 66: 70 ms in
  pieces of 200 kB). With
  both, each set has two communication phases a step, and two sets whose groups cross one
  uplink collide there every step (``benchmarks/collision.py --layout sets``).
  ``--set-offset SECONDS``: set s waits s x SECONDS before each forward (an offset set by
  hand, where an interleaving controller would set one).
- ``--start-at EPOCH_SECONDS``: every rank waits until that wall-clock time before its first
  step; with ``--cadence SECONDS`` step k starts no earlier than START + k x SECONDS (a
  schedule: two jobs on one fabric on the same cadence half a period apart keep their
  communication phases apart, ``benchmarks/collision.py``).

At the end every rank prints one JSON line: ``{"event": "step_stats", "rank": ..,
"step_time_mean_s": .., "step_time_cv": .., ...}`` (steps after ``--warmup``), with every
step's time in ``step_times_s`` and when it ended (wall clock) in ``step_ends_unix``.
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
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

STRAGGLER_KINDS = ("compute", "data", "sleep")


@dataclass(frozen=True)
class Straggler:
    rank: int
    kind: str
    amount_s: float


@dataclass
class RankPlan:
    """What this rank does beyond plain training."""

    compute_s: float = 0.0
    data_s: float = 0.0
    sleep_s: float = 0.0
    jitter_s: float = 0.0
    jitter_steps: tuple[int, int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def parse_straggler(text: str) -> Straggler:
    parts = text.split(":")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"--straggler {text!r}: expected RANK:KIND:AMOUNT")
    rank_s, kind, amount_s = parts
    if kind not in STRAGGLER_KINDS:
        raise argparse.ArgumentTypeError(
            f"--straggler {text!r}: KIND must be one of {', '.join(STRAGGLER_KINDS)}"
        )
    try:
        rank, amount = int(rank_s), float(amount_s)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--straggler {text!r}: RANK must be an int and AMOUNT seconds"
        ) from None
    if rank < 0 or amount < 0:
        raise argparse.ArgumentTypeError(f"--straggler {text!r}: RANK and AMOUNT must be >= 0")
    return Straggler(rank, kind, amount)


def parse_jitter(text: str) -> tuple[list[int], float]:
    try:
        ranks_s, amount_s = text.split(":")
        ranks = [int(r) for r in ranks_s.split(",") if r.strip()]
        amount = float(amount_s)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--jitter {text!r}: expected RANKS:AMOUNT, e.g. 1,3:0.03"
        ) from None
    if not ranks or amount < 0:
        raise argparse.ArgumentTypeError(f"--jitter {text!r}: need ranks and AMOUNT >= 0")
    return ranks, amount


def _int_pair(text: str, flag: str, names: tuple[str, str], least: int) -> tuple[int, int]:
    """``A:B`` as two ints with ``least <= A <= B``; an argparse error naming the flag."""
    try:
        first_s, second_s = text.split(":")
        first, second = int(first_s), int(second_s)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{flag} {text!r}: expected {names[0]}:{names[1]}"
        ) from None
    if not least <= first <= second:
        raise argparse.ArgumentTypeError(
            f"{flag} {text!r}: need {least} <= {names[0]} <= {names[1]}"
        )
    return first, second


def parse_batch_range(text: str) -> tuple[int, int]:
    return _int_pair(text, "--dynamic-batch", ("MIN", "MAX"), 1)


def parse_range(text: str) -> tuple[int, int]:
    return _int_pair(text, "--jitter-steps", ("START", "END"), 0)


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nprocs",
        type=int,
        default=4,
        help="ranks to spawn when not launched by torchrun (default 4)",
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=512, help="MLP width (step time knob)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the stats")
    parser.add_argument("--straggler", type=parse_straggler, action="append", default=[])
    parser.add_argument("--jitter", type=parse_jitter, default=None)
    parser.add_argument("--jitter-steps", type=parse_range, default=None)
    parser.add_argument("--dynamic-batch", type=parse_batch_range, default=None, metavar="MIN:MAX")
    parser.add_argument("--sample-time", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--sets", type=positive_int, default=1, metavar="S")
    parser.add_argument("--gather-bytes", type=non_negative_int, default=0, metavar="N")
    parser.add_argument("--set-offset", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--start-at", type=float, default=None, metavar="EPOCH_SECONDS")
    parser.add_argument("--cadence", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--no-instrument", action="store_true", help="baseline: no skewtrace")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    parser.add_argument("--job-id", default=None, help="default: SKEWTRACE_JOB_ID or generated")
    parser.add_argument("--seed", type=int, default=0)
    return parser


class SyntheticDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, size: int, features: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(size, features, generator=generator)
        self.targets = torch.randint(0, 10, (size,), generator=generator)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


class SlowCollate:
    """Default collation plus an optional per-batch wait: the ``data`` straggler."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __call__(self, batch: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return torch.utils.data.default_collate(batch)


class Net(nn.Module):
    def __init__(self, features: int, hidden: int, layers: int) -> None:
        super().__init__()
        blocks: list[nn.Module] = [nn.Linear(features, hidden), nn.ReLU()]
        for _ in range(layers - 1):
            blocks += [nn.Linear(hidden, hidden), nn.ReLU()]
        blocks.append(nn.Linear(hidden, 10))
        self.body = nn.Sequential(*blocks)
        # Set per step by the training loop: extra work inside forward (compute straggler).
        self.extra_compute_s = 0.0
        self.extra_sleep_s = 0.0
        self.sample_time_s = 0.0
        # --gather-bytes: the parameter gather that starts every forward (None: none).
        self.gather: Any = None
        self.offset_s = 0.0  # --set-offset

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.offset_s > 0:
            time.sleep(self.offset_s)
        if self.gather is not None:
            self.gather()
        if self.extra_compute_s > 0:
            busy_compute(self.extra_compute_s, inputs.device)
        if self.extra_sleep_s > 0:
            time.sleep(self.extra_sleep_s)
        if self.sample_time_s > 0:
            time.sleep(self.sample_time_s * len(inputs))
        return self.body(inputs)  # type: ignore[no-any-return]


GATHER_PIECE_BYTES = 256 * 1024


def parameter_gather(nbytes: int, group: Any, device: torch.device) -> Any:
    """A blocking gather of ``nbytes`` a rank over ``group``, unit by unit: all-gathers of at
    most GATHER_PIECE_BYTES each, one after the other."""
    shard = torch.zeros(max(1, nbytes // 4), device=device)
    pieces = shard.split(GATHER_PIECE_BYTES // 4)
    size = dist.get_world_size(group)
    outputs = [[torch.empty_like(piece) for _ in range(size)] for piece in pieces]

    def gather() -> None:
        for piece, output in zip(pieces, outputs, strict=True):
            dist.all_gather(output, piece, group=group)

    return gather


def busy_compute(seconds: float, device: torch.device) -> None:
    """Real arithmetic for ``seconds`` (a slow GPU/CPU, not an idle wait)."""
    a = torch.randn(128, 128, device=device)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rank_plan(args: argparse.Namespace, rank: int) -> RankPlan:
    plan = RankPlan(jitter_steps=args.jitter_steps)
    for straggler in args.straggler:
        if straggler.rank == rank:
            if straggler.kind == "compute":
                plan.compute_s += straggler.amount_s
            elif straggler.kind == "data":
                plan.data_s += straggler.amount_s
            else:
                plan.sleep_s += straggler.amount_s
    if args.jitter is not None and rank in args.jitter[0]:
        plan.jitter_s = args.jitter[1]
    return plan


def agreed_job_id(job_id: str | None) -> str:
    """The given id, else one rank 0 makes up and broadcasts (torchrun without --rdzv-id
    gives every job the run id "none", which skewtrace refuses)."""
    if job_id and job_id != "none":
        return job_id
    proposal = [f"train-ddp-{uuid.uuid4().hex[:8]}" if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(proposal, src=0)
    return str(proposal[0])


def train(args: argparse.Namespace) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    use_cuda = dist.get_backend() == "nccl"
    if use_cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        # Ranks share the CPUs: one thread each avoids oversubscription noise.
        torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    plan = rank_plan(args, rank)
    jitter_rng = random.Random(args.seed * 1000 + rank)
    batch_rng = random.Random(args.seed * 1000 + 500 + rank)

    features = 64
    dataset = SyntheticDataset(args.batch_size * max(args.steps, 1) * world, features, args.seed)
    sampler = torch.utils.data.DistributedSampler(
        dataset, num_replicas=world, rank=rank, seed=args.seed
    )
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        collate_fn=SlowCollate(plan.data_s),
        drop_last=True,
    )
    net = Net(features, args.hidden, args.layers).to(device)
    # --sets: a data-parallel group per set, created on every rank in the same order.
    dp_group = None
    if args.sets > 1:
        sets = [
            dist.new_group([r for r in range(world) if r % args.sets == s])
            for s in range(args.sets)
        ]
        dp_group = sets[rank % args.sets]
        net.offset_s = (rank % args.sets) * args.set_offset
    if args.gather_bytes > 0:
        net.gather = parameter_gather(args.gather_bytes, dp_group, device)
    model = DistributedDataParallel(
        net, device_ids=[device.index] if use_cuda else None, process_group=dp_group
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    if not args.no_instrument:
        import skewtrace

        skewtrace.instrument(
            model=model, optimizer=optimizer, dataloader=loader, job_id=agreed_job_id(args.job_id)
        )

    if args.start_at is not None:
        dist.barrier()  # every rank is up, then all start at the same wall-clock time
        time.sleep(max(0.0, args.start_at - time.time()))
    step_times: list[float] = []
    step_ends: list[float] = []  # wall clock, to line steps up with a controller's decisions
    step = 0
    last = time.perf_counter()
    while step < args.steps:
        for inputs, targets in loader:
            if step >= args.steps:
                break
            jitter_on = plan.jitter_steps is None or (
                plan.jitter_steps[0] <= step < plan.jitter_steps[1]
            )
            net.extra_compute_s = plan.compute_s
            net.extra_sleep_s = (
                jitter_rng.uniform(0, plan.jitter_s) if (plan.jitter_s > 0 and jitter_on) else 0.0
            )
            if args.cadence is not None and args.start_at is not None:
                time.sleep(max(0.0, args.start_at + step * args.cadence - time.time()))
            net.sample_time_s = args.sample_time
            if args.dynamic_batch is not None:
                size = batch_rng.randint(*args.dynamic_batch)
                inputs, targets = inputs[:size], targets[:size]
            inputs, targets = inputs.to(device), targets.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            # Averaged loss for logging: an explicit collective, as most scripts have.
            reported = loss.detach().clone()
            dist.all_reduce(reported)
            if plan.sleep_s > 0:
                time.sleep(plan.sleep_s)
            now = time.perf_counter()
            step_times.append(now - last)
            step_ends.append(time.time())
            last = now
            step += 1

    if not args.no_instrument:
        import skewtrace

        skewtrace.uninstrument()
    measured = step_times[args.warmup :] or step_times
    mean = statistics.fmean(measured) if measured else 0.0
    stdev = statistics.pstdev(measured) if len(measured) > 1 else 0.0
    return {
        "event": "step_stats",
        "rank": rank,
        "set": rank % args.sets,
        "world_size": world,
        "steps": len(step_times),
        "measured_steps": len(measured),
        "step_time_mean_s": mean,
        "step_time_cv": stdev / mean if mean > 0 else 0.0,
        "step_time_median_s": statistics.median(measured) if measured else 0.0,
        "instrumented": not args.no_instrument,
        "step_times_s": [round(t, 5) for t in step_times],
        "step_ends_unix": [round(t, 3) for t in step_ends],
        "final_loss": float(reported.item()) / world if step_times else None,
    }


def _backend(choice: str) -> str:
    if choice != "auto":
        return choice
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def worker(local_rank: int, args: argparse.Namespace, world: int) -> None:
    if "RANK" not in os.environ or os.environ.get("_TRAIN_DDP_SPAWNED") == "1":
        os.environ["RANK"] = str(local_rank)
        os.environ["LOCAL_RANK"] = str(local_rank)
        os.environ["WORLD_SIZE"] = str(world)
    backend = _backend(args.backend)
    if backend == "nccl" and torch.cuda.device_count() < world:
        backend = "gloo"
    dist.init_process_group(backend)
    try:
        stats = train(args)
        print(json.dumps(stats), flush=True)
        # Every rank is done with the group before any tears it down (gloo can abort a rank
        # whose peer destroys its group first: "terminate called without an active
        # exception", exit -6, about one run in 15 here).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.job_id is None:
        args.job_id = os.environ.get("SKEWTRACE_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID")
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if launched:
        worker(
            int(os.environ.get("LOCAL_RANK", os.environ["RANK"])),
            args,
            int(os.environ["WORLD_SIZE"]),
        )
        return 0
    if args.nprocs < 1:
        print("--nprocs must be >= 1", file=sys.stderr)
        return 2
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ["_TRAIN_DDP_SPAWNED"] = "1"
    if args.job_id is None:
        args.job_id = f"train-ddp-{uuid.uuid4().hex[:8]}"
    os.environ["SKEWTRACE_JOB_ID"] = args.job_id
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(args, args.nprocs), nprocs=args.nprocs, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
