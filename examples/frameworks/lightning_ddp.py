"""PyTorch Lightning: ``Trainer(strategy="ddp", accelerator="cpu")``, launched by torchrun.

    torchrun --nproc-per-node 4 examples/frameworks/lightning_ddp.py [--steps N]

Lightning sees torchrun's variables, joins the process group itself (gloo on CPU), wraps the
``LightningModule`` in ``DistributedDataParallel`` and owns the loop: ``training_step`` and
the backward run inside ``optimizer.step(closure)``. Per step, DDP's gradient all-reduce.
No logger, checkpoint, progress bar or validation: the run is the training steps alone.

In one-call mode (``SKEWTRACE_ONE_CALL=1``) a ``Callback`` calls ``skewtrace.instrument``
at ``on_fit_start``, the first hook where the DDP-wrapped model and the optimizer exist.
"""

from __future__ import annotations

import argparse
import os

import _knobs
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self, width: int, slow: _knobs.SlowRank) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))
        self.slow = slow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.slow()
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _index: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class OneCall(pl.Callback):
    """``SKEWTRACE_ONE_CALL=1``: instrument the wrapped model and the optimizer at fit start."""

    def on_fit_start(self, trainer: pl.Trainer, _module: pl.LightningModule) -> None:
        _knobs.one_call(trainer.strategy.model, trainer.optimizers[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--devices", type=int, default=int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    args = parser.parse_args()
    pl.seed_everything(0, verbose=False)
    data = TensorDataset(torch.randn(64 * args.steps, args.width), torch.randn(64 * args.steps, 1))
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=args.devices,
        max_steps=args.steps,
        callbacks=[OneCall()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Regressor(args.width, _knobs.SlowRank()), DataLoader(data, batch_size=16))
    _knobs.write_collective_counts()  # Lightning destroys the process group at exit


if __name__ == "__main__":
    main()
