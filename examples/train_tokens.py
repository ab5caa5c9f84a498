"""A small transformer on sequences of varying length, each global batch split by count or by
work (:class:`skewtrace.rank.work_balance.WorkBalancedSampler`).

Launch with torchrun (``torchrun --nproc-per-node 4 examples/train_tokens.py --balance work``)
or by itself (``python examples/train_tokens.py --nprocs 4 --balance work``: spawns the
ranks). CPU and gloo. Spans go to ``OTEL_EXPORTER_OTLP_ENDPOINT`` like any OTel program
(``skewtrace.instrument(...)``, one call, with the loader: its ``dataloader.fetch`` spans carry
``training.balance.mode``).

The job: sequence lengths log-normal (median ``--median`` tokens, sigma 1, clipped to
16..8 x median), a copy task (each token's target is the one before it), an embedding, one
``TransformerEncoderLayer`` and a head; each rank's batch is packed without padding (one
tensor of its tokens, so the forward's ``training.input.size`` is its real tokens) and each
sequence runs at its own length. The loss is summed over the rank's tokens and scaled by
``sampler.token_loss_scale(index)`` (``world_size / global batch tokens``), so the update is
the mean token gradient of the global batch whichever rank ran which sequence.

``--balance``:

- ``count``: equal sample counts per rank (as ``DistributedSampler``): the rank that drew the
  long sequences is late, a different one each step; the Collector calls it a
  ``data_imbalance``;
- ``work``: each global batch (the same samples) split so that each rank gets an equal share
  of its work, the cost model (``a*t + b*t^2`` per sequence of ``t`` tokens) fitted online
  from the ranks' forward times;
- ``pacer``: the controller decides (``SKEWTRACE_PACER_URL`` and ``skewtrace pacer --policy
  balance``): by count until the Collector flags the job's ``data_imbalance``, then by work
  while the pacer's effect guard finds that it pays (it alternates count and work phases to
  measure it). Without a pacer: by count.

Modelled device time: four ranks on a machine with two cores share the cores, so a rank
that finishes early gives its core to the one still computing, and real compute alone does
not show what four accelerators would. Each sequence therefore also costs
``a*t + b*t^2`` seconds of sleep in the forward (``a`` = ``--device-us-per-token``, ``b`` such
that the quadratic term equals the linear one at 2,048 tokens), as benchmarks/work_balance.py
and benchmarks/rebalance.py model device time; ``--device-us-per-token 0`` turns it off (on
real accelerators). The real compute still runs and decides the losses.

Ctrl-C (SIGINT) or SIGTERM ends the job after the step under way, on every rank at the same
step (the flag rides the step's loss all-reduce), with the spans flushed. At the end every rank
prints one JSON line ``{"event": "tokens_stats", "rank": .., "modes": [...],
"balance_versions": [...], "step_s": [...], "loss": [...], ...}`` (one entry per step).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import sys
import time
import uuid
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

VOCAB = 48
CROSSOVER = 2048.0
"""Tokens at which the modelled device's quadratic (attention) term equals its linear one."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nprocs", type=int, default=4, help="ranks to spawn (without torchrun)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--balance", choices=("count", "work", "pacer"), default="work")
    parser.add_argument("--global-batch", type=int, default=32, help="sequences per step")
    parser.add_argument("--median", type=float, default=256.0, help="median tokens a sequence")
    parser.add_argument("--device-us-per-token", type=float, default=30.0)
    parser.add_argument("--sync-every", type=int, default=4, help="steps between sync points")
    parser.add_argument("--job-id", default=None)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def sequence_lengths(count: int, median: float, seed: int) -> list[int]:
    """Log-normal lengths (sigma 1), clipped to 16..8 x median."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.exp(math.log(median) + torch.randn(count, generator=generator))
    return [int(min(8 * median, max(16, round(v)))) for v in values.tolist()]


class Sequences(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sequence i: random tokens of ``lengths[i]``; each token's target is the one before it."""

    def __init__(self, lengths: list[int], seed: int) -> None:
        self.lengths = lengths
        self.seed = seed

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        tokens = torch.randint(1, VOCAB, (self.lengths[index],), generator=generator)
        targets = torch.roll(tokens, 1)
        targets[0] = 0
        return tokens, targets


def pack(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[Any, Any, list[int]]:
    """A batch packed without padding: all tokens, all targets, each sequence's length."""
    tokens = torch.cat([t for t, _ in samples])
    targets = torch.cat([y for _, y in samples])
    return tokens, targets, [len(t) for t, _ in samples]


class TinyTransformer(nn.Module):
    def __init__(self, d_model: int, device_s_per_token: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        self.layer = nn.TransformerEncoderLayer(
            d_model, 2, 2 * d_model, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(d_model, VOCAB)
        self.a = device_s_per_token
        self.b = device_s_per_token / CROSSOVER

    def forward(self, tokens: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """The logits of every token; each sequence attends only within itself."""
        out = [self.head(self.layer(self.embed(s[None])))[0] for s in tokens.split(lengths)]
        if self.a > 0:  # the modelled device time of these sequences
            time.sleep(sum(self.a * t + self.b * t * t for t in lengths))
        return torch.cat(out)


_stop = False


def _ask_stop(_signum: int, _frame: Any) -> None:
    global _stop
    _stop = True


def train(args: argparse.Namespace) -> dict[str, Any]:
    import skewtrace
    from skewtrace.rank.work_balance import WorkBalancedSampler

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    lengths = sequence_lengths(args.global_batch * 40, args.median, args.seed + 7)
    data = Sequences(lengths, args.seed)
    sampler = WorkBalancedSampler(
        data,
        args.global_batch,
        lengths=lengths,
        mode=args.balance,
        seed=args.seed,
        sync_every=args.sync_every,
    )
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=pack)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(TinyTransformer(16, args.device_us_per_token * 1e-6))
    sampler.time_forward(model)  # the cost model, fitted online from the forwards
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    skewtrace.instrument(model=model, optimizer=optimizer, dataloader=loader, job_id=args.job_id)

    stats: dict[str, list[Any]] = {
        k: [] for k in ("step_s", "modes", "balance_versions", "cost_versions", "tokens", "loss")
    }
    last = time.perf_counter()
    step, epoch, stop = 0, 0, False
    while step < args.steps and not stop:
        sampler.set_epoch(epoch)
        for index, (tokens, targets, sizes) in enumerate(loader):
            logits = model(tokens, sizes)
            loss = nn.functional.cross_entropy(logits, targets, reduction="sum")
            (loss * sampler.token_loss_scale(index)).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            # The global batch's loss per token for the log, and whether to stop (a signal to
            # any rank): one all-reduce, as most scripts have one for logging.
            logged = torch.tensor([loss.item(), float(_stop)], dtype=torch.float64)
            dist.all_reduce(logged)
            plan = sampler.step_plan(index)
            now = time.perf_counter()
            stats["step_s"].append(round(now - last, 6))
            last = now
            stats["modes"].append(plan.mode)
            stats["balance_versions"].append(plan.version)
            stats["cost_versions"].append(plan.cost_version)
            stats["tokens"].append(plan.local_tokens)
            stats["loss"].append(round(logged[0].item() / plan.global_tokens, 6))
            step += 1
            stop = logged[1].item() > 0
            if step >= args.steps or stop:
                break
        epoch += 1
    skewtrace.uninstrument()
    cost = sampler.cost
    return {"event": "tokens_stats", "rank": rank, "world_size": world, "steps": step,
            "balance": args.balance, "cost": [cost.linear, cost.quadratic], **stats}  # fmt: skip


def worker(local_rank: int, args: argparse.Namespace, world: int) -> None:
    if os.environ.get("_TRAIN_TOKENS_SPAWNED") == "1":
        os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world))
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _ask_stop)
    dist.init_process_group("gloo")
    try:
        print(json.dumps(train(args)), flush=True)
        dist.barrier()  # every rank is done with the group before any tears it down
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        # torchrun: the job id is --job-id, SKEWTRACE_JOB_ID or the launcher's (skewtrace reads
        # them; with none the ranks agree on one through the process group's store).
        worker(int(os.environ["RANK"]), args, int(os.environ["WORLD_SIZE"]))
        return 0
    if args.job_id is None:
        args.job_id = os.environ.get("SKEWTRACE_JOB_ID") or f"tokens-{uuid.uuid4().hex[:8]}"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        os.environ.setdefault("MASTER_PORT", str(sock.getsockname()[1]))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["_TRAIN_TOKENS_SPAWNED"] = "1"
    import torch.multiprocessing as mp

    ranks = mp.spawn(worker, args=(args, args.nprocs), nprocs=args.nprocs, join=False)

    def forward(signum: int, _frame: Any) -> None:
        # Ctrl-C reaches the ranks by itself (the terminal's process group); a SIGTERM to this
        # process alone is passed on. Each rank stops after its step under way.
        if signum == signal.SIGTERM:
            for process in ranks.processes:
                if process.is_alive() and process.pid is not None:
                    os.kill(process.pid, signal.SIGTERM)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    while not ranks.join():
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
