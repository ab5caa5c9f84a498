"""transformers.Trainer with the work-balanced sampler, launched by torchrun
(tests/test_work_balance.py).

    torchrun --nproc-per-node 2 tests/work_balance_trainer.py --mode work --out DIR

The one change: a Trainer subclass whose ``get_train_dataloader`` returns the loader over the
sampler without ``accelerator.prepare`` (whose ``BatchSamplerShard`` would split each rank's
batch again), with the sampler's ``set_epoch`` on it (the Trainer calls the loader's at each
epoch). The loss needs nothing: with ``average_tokens_across_devices`` (the default) and a
model whose forward takes ``**kwargs``, the Trainer passes ``num_items_in_batch``, the global
batch's label tokens (all-gathered), and multiplies the loss by the number of processes.
Each rank writes the samples it trained on and its final parameters to ``DIR/rank<N>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from transformers import Trainer, TrainingArguments

from skewtrace.rank.work_balance import WorkBalancedSampler
from work_balance_job import JobConfig, Sequences, TinyTransformer


class Records(Dataset[dict[str, Any]]):
    def __init__(self, inner: Sequences) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> dict[str, Any]:
        tokens, targets = self.inner[index]
        return {"input_ids": tokens, "labels": targets, "sample_idx": index}


def pad(batch: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Right-padded ids, labels -100 past each sample's length, and the sample indices."""
    longest = max(len(item["input_ids"]) for item in batch)
    ids = torch.zeros(len(batch), longest, dtype=torch.long)
    labels = torch.full((len(batch), longest), -100, dtype=torch.long)
    for row, item in enumerate(batch):
        n = len(item["input_ids"])
        ids[row, :n] = item["input_ids"]
        labels[row, :n] = item["labels"]
    return {
        "input_ids": ids,
        "labels": labels,
        "sample_idx": torch.tensor([item["sample_idx"] for item in batch]),
    }


class TokenLM(nn.Module):
    """Each sequence run at its own length; the loss summed over label tokens and divided by
    ``num_items_in_batch`` (the Trainer's global count) when given."""

    def __init__(self, config: JobConfig) -> None:
        super().__init__()
        self.net = TinyTransformer(config).double()
        self.seen: list[list[int]] = []

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor, sample_idx: torch.Tensor, **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        self.seen.append(sample_idx.tolist())
        lengths = (labels != -100).sum(dim=1).tolist()
        samples = [(input_ids[r, :n], labels[r, :n]) for r, n in enumerate(lengths)]
        total = self.net(samples)
        items = kwargs.get("num_items_in_batch")
        return {"loss": total / items if items is not None else total / sum(lengths)}


class BalancedTrainer(Trainer):
    def __init__(self, *args: Any, sampler: WorkBalancedSampler, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.work_sampler = sampler

    def get_train_dataloader(self) -> DataLoader[Any]:
        loader = DataLoader(self.train_dataset, batch_sampler=self.work_sampler, collate_fn=pad)
        loader.set_epoch = self.work_sampler.set_epoch  # type: ignore[attr-defined]
        return loader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mode", default="work")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = JobConfig(samples=16 * 3, global_batch=16)
    data = Sequences(config)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    sampler = WorkBalancedSampler(
        data, 16, lengths=data.lengths, num_replicas=world, rank=rank, seed=5, mode=args.mode
    )
    torch.manual_seed(0)
    model = TokenLM(config)
    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(
            output_dir=output_dir,
            use_cpu=True,
            ddp_backend="gloo",
            report_to=[],
            max_steps=6,
            optim="sgd",
            learning_rate=0.05,
            lr_scheduler_type="constant",
            save_strategy="no",
            eval_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            remove_unused_columns=False,
            seed=0,
        )
        trainer = BalancedTrainer(
            model=model, args=training_args, train_dataset=Records(data), sampler=sampler
        )
        trainer.train()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "seen": model.seen,
                "params": [p.detach().flatten().tolist() for p in model.parameters()],
            }
        )
    )


if __name__ == "__main__":
    main()
