"""DeepSpeed ZeRO: ``deepspeed.initialize`` with a ZeRO config, ``engine.backward`` and
``engine.step``, launched by torchrun.

    torchrun --nproc-per-node 4 examples/frameworks/deepspeed_zero.py [--steps N] [--stage 1|2|3]

Runs on CPU with gloo (DeepSpeed's CPU accelerator, picked when no GPU is visible, uses gloo
when oneCCL's bindings are not installed) or on GPUs with NCCL. ZeRO
stages 1 and 2 reduce the gradients and all-gather the updated parameter partitions over a
data-parallel group of their own; stage 3 also all-gathers each layer's parameters before its
forward and backward. The optimizer is DeepSpeed's ``AdamW`` with ``torch_adam`` (no compiled
optimizer op needed). On CPU, DeepSpeed compiles its shared-memory communication op the first
time it starts (C++ compiler and ninja; cached in ``~/.cache/torch_extensions``).

In one-call mode (``SKEWTRACE_ONE_CALL=1``) the script calls ``skewtrace.instrument`` after
``deepspeed.initialize``, with the engine and the optimizer it returned (skewtrace hooks the
torch optimizer inside the ZeRO optimizer).
"""

from __future__ import annotations

import argparse

import _knobs
import deepspeed
import torch
import torch.distributed as dist
from torch import nn


class Model(nn.Module):
    def __init__(self, width: int, depth: int, slow: _knobs.SlowRank) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.ReLU())
                                      for _ in range(depth)))  # fmt: skip
        self.head = nn.Linear(width, 1)
        self.slow = slow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.slow()
        return self.head(self.blocks(x))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--stage", type=int, default=2, choices=(1, 2, 3))
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--depth", type=int, default=2)
    args = parser.parse_args()
    deepspeed.init_distributed()
    torch.manual_seed(0)
    model = Model(args.width, args.depth, _knobs.SlowRank())
    config = {
        "train_micro_batch_size_per_gpu": 16,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": args.stage},
    }
    engine, optimizer, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    _knobs.one_call(engine, optimizer)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(args.steps):
        x = torch.randn(16, args.width, generator=generator).to(engine.device)
        y = torch.randn(16, 1, generator=generator).to(engine.device)
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
    _knobs.write_collective_counts()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
