"""Lightning with the work-balanced sampler, launched by torchrun (tests/test_work_balance.py).

    torchrun --nproc-per-node 2 tests/work_balance_lightning.py --out DIR

The one line Lightning needs: ``Trainer(use_distributed_sampler=False)``, so that it keeps the
loader's batch sampler instead of putting a ``DistributedSampler`` in. Lightning sets the
epoch itself, through ``loader.batch_sampler.sampler.set_epoch`` (the sampler's ``sampler``
is itself). The loss: the token losses' sum times
``sampler.token_loss_scale(batch_idx)`` (``batch_idx`` is the batch's index in the epoch).
Each rank writes what it trained on, step by step, to ``DIR/rank<N>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from skewtrace.rank.work_balance import WorkBalancedSampler
from work_balance_job import JobConfig, Sequences, TinyTransformer


class Indexed(Dataset[tuple[int, torch.Tensor, torch.Tensor]]):
    def __init__(self, inner: Sequences) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return (index, *self.inner[index])


def as_list(batch: list[Any]) -> list[Any]:
    return batch


class Module(pl.LightningModule):
    def __init__(self, config: JobConfig, sampler: WorkBalancedSampler) -> None:
        super().__init__()
        self.net = TinyTransformer(config).double()
        self.sampler = sampler
        self.seen: list[dict[str, Any]] = []

    def training_step(self, batch: list[Any], batch_idx: int) -> torch.Tensor:
        plan = self.sampler.step_plan(batch_idx)
        loss = self.net([(tokens, targets) for _, tokens, targets in batch])
        self.seen.append(
            {
                "epoch": self.current_epoch,
                "index": batch_idx,
                "got": [int(i) for i, _, _ in batch],
                "planned": list(plan.indices),
                "global": list(plan.global_indices),
                "mode": plan.mode,
            }
        )
        return loss * self.sampler.token_loss_scale(batch_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    config = JobConfig(samples=16 * 3, global_batch=16)
    data = Sequences(config)
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    sampler = WorkBalancedSampler(
        data, 16, lengths=data.lengths, num_replicas=world, rank=rank, seed=5, sync_every=2
    )
    module = Module(config, sampler)
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=world,
        max_epochs=args.epochs,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, DataLoader(Indexed(data), batch_sampler=sampler, collate_fn=as_list))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(module.seen))


if __name__ == "__main__":
    main()
