"""Pipeline parallel with ``torch.distributed.pipelining``: one stage per rank, the 1F1B
schedule (``Schedule1F1B``) over microbatches, a plain training loop around it.

    torchrun --nproc-per-node 4 examples/frameworks/pipelining.py [--steps N]
        [--layers 16] [--heavy-head 1.4] [--split-points 4,8,13]

The model is ``--layers`` blocks (``Linear`` + ReLU) and a loss head, the head the last
layer. Each rank's stage holds a contiguous run of those layers: by default the blocks split
evenly and the head on the last stage; ``--split-points`` (or ``SPLIT_POINTS``) gives the
index of each stage's first layer after stage 0, as ``skewtrace advise`` prints it (the
layers are numbered 0 to ``--layers``, the head last). ``--heavy-head F`` (or
``HEAVY_HEAD``) makes the head cost ``F - 1`` times an even stage's blocks, so that under
the even split the last stage does ``F`` times the work of each other stage; 1 (the default)
gives a light head (a ``LayerNorm``).

Activations go forward and gradients back as point-to-point messages between neighbouring
stages (``batch_isend_irecv``); each stage runs one forward and one backward per microbatch.
"""

from __future__ import annotations

import argparse
import os

import _knobs
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class Head(nn.Module):
    """Two ``Linear`` through a hidden width: about ``2 * hidden / width`` blocks of work."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class Stage(nn.Module):
    def __init__(self, layers: list[nn.Module], slow: _knobs.SlowRank) -> None:
        super().__init__()
        self.layers = nn.Sequential(*layers)
        self.slow = slow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.slow()
        return self.layers(x)


def parse_split_points(text: str | None, n_layers: int, stages: int) -> list[int]:
    """The split points (each stage's first layer after stage 0), checked; the even split of
    the blocks (the head on the last stage) when none are given."""
    if not text:
        per, extra = divmod(n_layers - 1, stages)
        points, at = [], 0
        for s in range(stages - 1):
            at += per + (1 if s < extra else 0)
            points.append(at)
        return points
    points = [int(p) for p in text.replace(" ", "").split(",") if p]
    if len(points) != stages - 1 or any(
        b <= a for a, b in zip([0, *points], [*points, n_layers], strict=True)
    ):
        raise SystemExit(
            f"--split-points {text!r}: need {stages - 1} increasing points in 1..{n_layers - 1}"
        )
    return points


def build_layers(layers: int, width: int, heavy_head: float, stages: int) -> list[nn.Module]:
    out: list[nn.Module] = [Block(width) for _ in range(layers)]
    if heavy_head > 1:
        hidden = max(1, round((heavy_head - 1) * layers / stages * width / 2))
        out.append(Head(width, hidden))
    else:
        out.append(nn.LayerNorm(width))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--rows", type=int, default=4, help="rows per microbatch")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument(
        "--heavy-head", type=float, default=float(os.environ.get("HEAVY_HEAD", "1"))
    )
    parser.add_argument("--split-points", default=os.environ.get("SPLIT_POINTS"))
    args = parser.parse_args()
    device = _knobs.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    # Every rank builds the whole model from one seed and keeps its stage's layers.
    torch.manual_seed(0)
    layers = build_layers(args.layers, args.width, args.heavy_head, world)
    points = parse_split_points(args.split_points, len(layers), world)
    bounds = [0, *points, len(layers)]
    # The slow rank's delay is spread over its microbatches' forwards.
    slow = _knobs.SlowRank(forwards_per_step=args.microbatches)
    slow.delay_s /= args.microbatches
    module = Stage(layers[bounds[rank] : bounds[rank + 1]], slow).to(device)
    stage = PipelineStage(module, rank, world, device)
    schedule = Schedule1F1B(
        stage, n_microbatches=args.microbatches, loss_fn=lambda out, y: (out - y).pow(2).mean()
    )
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-2)
    _knobs.one_call(module, optimizer)
    generator = torch.Generator().manual_seed(0)
    batch = args.rows * args.microbatches
    for _ in range(args.steps):
        x = torch.randn(batch, args.width, generator=generator).to(device)
        y = torch.randn(batch, args.width, generator=generator).to(device)
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        optimizer.step()
        optimizer.zero_grad()
    _knobs.write_collective_counts()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
