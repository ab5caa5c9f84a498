"""Hugging Face Accelerate: a tiny GPT-2 built from a ``GPT2Config`` (nothing downloaded),
``accelerator.prepare`` and ``accelerator.backward``, launched by torchrun.

    torchrun --nproc-per-node 4 examples/frameworks/accelerate_gpt2.py [--steps N]

``Accelerator()`` joins the process group (with ``cpu=True`` where no GPU is visible: gloo;
without it a CUDA build of torch on a machine with no GPU runs every rank alone), ``prepare``
wraps the model in ``DistributedDataParallel``, the optimizer in ``AcceleratedOptimizer`` and
shards the data loader over the ranks. Per step, DDP's gradient all-reduce. Random token ids
stand in for text.

In one-call mode (``SKEWTRACE_ONE_CALL=1``) the script calls ``skewtrace.instrument`` right
after ``prepare``, with the prepared model and optimizer as ``prepare`` returned them
(skewtrace hooks the torch optimizer inside Accelerate's wrapper).
"""

from __future__ import annotations

import argparse

import _knobs
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    args = parser.parse_args()
    # On a machine without GPUs (or with a torch built for CUDA and no GPU): gloo on CPU.
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=256,
        n_positions=args.seq_len,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    slow = _knobs.SlowRank()
    # Inside the model's forward (on its transformer body), whatever wraps or hooks the model.
    model.transformer.register_forward_pre_hook(lambda _module, _args: slow())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    samples = args.steps * args.batch_size * accelerator.num_processes
    tokens = torch.randint(0, config.vocab_size, (samples, args.seq_len))
    loader = DataLoader(TensorDataset(tokens), batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    _knobs.one_call(model, optimizer)
    model.train()
    for (input_ids,) in loader:
        loss = model(input_ids=input_ids, labels=input_ids).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    _knobs.write_collective_counts()
    accelerator.end_training()


if __name__ == "__main__":
    main()
