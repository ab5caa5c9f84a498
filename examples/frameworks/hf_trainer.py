"""transformers.Trainer: a tiny GPT-2 from a ``GPT2Config`` (nothing downloaded), a small
synthetic ``Dataset``, ``TrainingArguments(use_cpu=True, ddp_backend="gloo")``, launched by
torchrun.

    torchrun --nproc-per-node 4 examples/frameworks/hf_trainer.py [--steps N]

The Trainer joins the process group (through Accelerate), wraps the model in
``DistributedDataParallel``, shards the data over the ranks and owns the loop. Per step, DDP's
gradient all-reduce; at the end, the gathers of the training loss for the final log. No
checkpoint, evaluation or reporting integration.

In one-call mode (``SKEWTRACE_ONE_CALL=1``) a ``TrainerCallback`` calls ``skewtrace.instrument``
at ``on_train_begin``, with the model and the optimizer the callback is given (Accelerate's
wrapper; skewtrace hooks the torch optimizer inside).
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import _knobs
import torch
from torch.utils.data import Dataset
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class RandomTokens(Dataset):
    """Random token ids, the same on every rank (the Trainer shards them)."""

    def __init__(self, samples: int, seq_len: int, vocab_size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, vocab_size, (samples, seq_len), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class OneCall(TrainerCallback):
    """``SKEWTRACE_ONE_CALL=1``: instrument the model and the optimizer as training begins."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        optimizer = kwargs["optimizer"]
        _knobs.one_call(kwargs["model"], optimizer)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    args = parser.parse_args()
    config = GPT2Config(
        vocab_size=256,
        n_positions=args.seq_len,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    slow = _knobs.SlowRank()
    # Inside the model's forward (on its transformer body), whatever wraps or hooks the model.
    model.transformer.register_forward_pre_hook(lambda _module, _args: slow())
    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(
            output_dir=output_dir,
            use_cpu=True,
            ddp_backend="gloo",
            report_to=[],
            max_steps=args.steps,
            per_device_train_batch_size=args.batch_size,
            learning_rate=1e-3,
            save_strategy="no",
            eval_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            seed=0,
        )
        world = training_args.world_size
        dataset = RandomTokens(args.steps * args.batch_size * world, args.seq_len, 256)
        trainer = Trainer(
            model=model, args=training_args, train_dataset=dataset, callbacks=[OneCall()]
        )
        trainer.train()
    _knobs.write_collective_counts()


if __name__ == "__main__":
    main()
