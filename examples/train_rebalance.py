"""A DDP job on ranks of unequal speed, with each rank's share of the global batch from the pacer.

Launch with torchrun (``torchrun --nproc-per-node 4 examples/train_rebalance.py --slow 0:0.5``)
or by itself (``python examples/train_rebalance.py --nprocs 4 --slow 0:0.5``: spawns the
ranks). Spans go to ``OTEL_EXPORTER_OTLP_ENDPOINT`` like any OTel program; with
``SKEWTRACE_PACER_URL`` set and ``skewtrace pacer --policy rebalance`` running, rank 0 reads
the shares and :class:`skewtrace.rank.rebalance_sampler.ShareSampler` applies them on every rank.

The rank's own work per sample is modelled: ``--per-sample-millis`` of device time per
sample, slept inside the model's forward (a sleep, so that four ranks on a two-core machine
behave like four accelerators instead of fighting over the CPUs), divided by the rank's
speed. The model itself is a small MLP that really trains.

- ``--slow RANK:SPEED`` (repeatable): that rank runs at SPEED (0.5: half speed).
- ``--jitter RANKS:AMOUNT``: a uniform 0..AMOUNT s sleep per step inside forward on those
  ranks (arrival jitter that pacing acts on).
- ``--sampler share`` (default):
  :class:`~skewtrace.rank.rebalance_sampler.ShareSampler`, equal shares
  without a pacer; ``--sampler distributed``: plain ``DistributedSampler`` (the baseline).

At the end every rank prints one JSON line ``{"event": "rebalance_stats", "rank": ..,
"step_s": [...], "sizes": [...], "loss": [...], ...}`` (one entry per step).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import time
import uuid
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def parse_slow(text: str) -> tuple[int, float]:
    try:
        rank_s, speed_s = text.split(":")
        rank, speed = int(rank_s), float(speed_s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--slow {text!r}: expected RANK:SPEED") from None
    if rank < 0 or not 0 < speed <= 1:
        raise argparse.ArgumentTypeError(f"--slow {text!r}: need RANK >= 0, 0 < SPEED <= 1")
    return rank, speed


def parse_jitter(text: str) -> tuple[list[int], float]:
    try:
        ranks_s, amount_s = text.split(":")
        ranks, amount = [int(r) for r in ranks_s.split(",") if r.strip()], float(amount_s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--jitter {text!r}: expected RANKS:AMOUNT") from None
    return ranks, amount


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nprocs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--dataset-size", type=int, default=4133, help="samples per epoch")
    parser.add_argument("--per-sample-millis", type=float, default=1.5)
    parser.add_argument("--slow", type=parse_slow, action="append", default=[])
    parser.add_argument("--jitter", type=parse_jitter, default=None)
    parser.add_argument("--sampler", choices=("share", "distributed"), default="share")
    parser.add_argument("--sync-every", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--no-instrument", action="store_true")
    parser.add_argument("--job-id", default=None)
    parser.add_argument("--seed", type=int, default=0)
    return parser


class SyntheticDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A learnable task: the label is the argmax of a fixed random projection."""

    def __init__(self, size: int, features: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(size, features, generator=generator)
        projection = torch.randn(features, 10, generator=generator)
        self.targets = (self.inputs @ projection).argmax(dim=1)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


class Net(nn.Module):
    def __init__(self, features: int, hidden: int, per_sample_s: float) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 10),
        )  # fmt: skip
        self.per_sample_s = per_sample_s
        self.extra_s = 0.0  # set per step: jitter

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        # The modelled device time of this batch: proportional to its size.
        time.sleep(len(inputs) * self.per_sample_s + self.extra_s)
        return self.body(inputs)  # type: ignore[no-any-return]


def train(args: argparse.Namespace) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    speed = dict(args.slow).get(rank, 1.0)
    jitter = args.jitter[1] if args.jitter and rank in args.jitter[0] else 0.0
    jitter_rng = random.Random(args.seed * 1000 + rank)

    features = 32
    dataset = SyntheticDataset(args.dataset_size, features, args.seed)
    sampler: Any
    if args.sampler == "share":
        from skewtrace.rank.rebalance_sampler import ShareSampler

        sampler = ShareSampler(
            dataset, args.global_batch, seed=args.seed, sync_every=args.sync_every
        )
        loader = DataLoader(dataset, batch_sampler=sampler)
    else:
        sampler = DistributedSampler(dataset, seed=args.seed, drop_last=True)
        loader = DataLoader(
            dataset, batch_size=args.global_batch // world, sampler=sampler, drop_last=True
        )
    net = Net(features, args.hidden, args.per_sample_millis / 1000.0 / speed)
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    if not args.no_instrument:
        import skewtrace

        skewtrace.instrument(
            model=model, optimizer=optimizer, dataloader=loader, job_id=args.job_id
        )

    step_s: list[float] = []
    sizes: list[int] = []
    global_sizes: list[int] = []
    versions: list[int] = []
    losses: list[float] = []
    started = time.perf_counter()
    last = started
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for index, (inputs, targets) in enumerate(loader):
            if step >= args.steps:
                break
            net.extra_s = jitter_rng.uniform(0, jitter) if jitter > 0 else 0.0
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(inputs), targets)
            if args.sampler == "share":
                scale = sampler.loss_scale(len(inputs), index)
                global_size = sampler.global_batch_size_at(index)
                versions.append(sampler.shares_version)
            else:
                scale, global_size = 1.0, args.global_batch
                versions.append(0)
            (loss * scale).backward()
            optimizer.step()
            # The global batch's mean loss, for the curve: an explicit collective, as most
            # scripts have one for logging.
            reported = (loss.detach() * scale).reshape(1)
            dist.all_reduce(reported)
            losses.append(float(reported.item()) / world)
            now = time.perf_counter()
            step_s.append(now - last)
            last = now
            sizes.append(len(inputs))
            global_sizes.append(global_size)
            step += 1
        epoch += 1

    if not args.no_instrument:
        import skewtrace

        skewtrace.uninstrument()
    return {
        "event": "rebalance_stats",
        "rank": rank,
        "world_size": world,
        "speed": speed,
        "wall_s": time.perf_counter() - started,
        "step_s": [round(s, 6) for s in step_s],
        "sizes": sizes,
        "global_sizes": global_sizes,
        "shares_version": versions,
        "loss": [round(v, 6) for v in losses],
    }


def worker(local_rank: int, args: argparse.Namespace, world: int) -> None:
    if os.environ.get("_TRAIN_REBALANCE_SPAWNED") == "1":
        os.environ["RANK"] = str(local_rank)
        os.environ["LOCAL_RANK"] = str(local_rank)
        os.environ["WORLD_SIZE"] = str(world)
    dist.init_process_group("gloo")
    try:
        print(json.dumps(train(args)), flush=True)
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
    args = build_parser().parse_args(argv)
    if args.job_id is None:
        args.job_id = os.environ.get("SKEWTRACE_JOB_ID") or f"rebalance-{uuid.uuid4().hex[:8]}"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        worker(int(os.environ["RANK"]), args, int(os.environ["WORLD_SIZE"]))
        return 0
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ["_TRAIN_REBALANCE_SPAWNED"] = "1"
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(args, args.nprocs), nprocs=args.nprocs, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
