"""Accelerate with the work-balanced sampler, launched by torchrun (tests/test_work_balance.py).

    torchrun --nproc-per-node 2 tests/work_balance_accelerate.py --mode work --out DIR

The one rule: ``accelerator.prepare(model, optimizer)`` but not the loader (its
``BatchSamplerShard`` would split each rank's batch again); batches are moved to
``accelerator.device`` by hand, and the summed token loss is scaled by
``sampler.token_loss_scale(index)`` before ``accelerator.backward``. Each rank writes the
samples it trained on and its final parameters to ``DIR/rank<N>.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from skewtrace.rank.work_balance import WorkBalancedSampler
from work_balance_job import JobConfig, Sequences, TinyTransformer
from work_balance_lightning import Indexed, as_list


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mode", default="work")
    args = parser.parse_args()
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    config = JobConfig(samples=16 * 3, global_batch=16)
    data = Sequences(config)
    sampler = WorkBalancedSampler(
        data,
        16,
        lengths=data.lengths,
        num_replicas=accelerator.num_processes,
        rank=accelerator.process_index,
        seed=5,
        mode=args.mode,
    )
    loader = DataLoader(Indexed(data), batch_sampler=sampler, collate_fn=as_list)
    torch.manual_seed(0)
    model = TinyTransformer(config).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)  # not the loader
    seen: list[list[int]] = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for index, batch in enumerate(loader):
            samples: list[Any] = [
                (tokens.to(accelerator.device), targets.to(accelerator.device))
                for _, tokens, targets in batch
            ]
            seen.append([int(i) for i, _, _ in batch])
            loss = model(samples) * sampler.token_loss_scale(index)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    args.out.mkdir(parents=True, exist_ok=True)
    params = [p.detach().flatten().tolist() for p in accelerator.unwrap_model(model).parameters()]
    (args.out / f"rank{accelerator.process_index}.json").write_text(
        json.dumps({"seen": seen, "params": params})
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
