"""Fault knobs of the example jobs: making ranks late on purpose, over chosen steps.

Every fault takes an optional step window ``@START:END``: active for steps in
``[START, END)``; ``@START:`` (or ``@START``) means until the end, no window means always.
Steps count from 0, as the spans' ``training.step`` does.

- ``--straggler RANK:KIND:AMOUNT[@START:END]``: KIND ``compute`` is AMOUNT seconds of busy
  compute inside the rank's forward (a slow GPU); ``data`` makes the rank's loader wait AMOUNT
  seconds per batch (slow storage); ``sleep`` is an idle AMOUNT seconds outside the traced
  phases (a descheduled process).
- ``--jitter RANKS:AMOUNT[@START:END]`` (``1,3:0.03``): uniform 0..AMOUNT seconds of busy
  compute per step inside forward on those ranks (noisy neighbours).
- ``--slow-rank RANK:FACTOR``: the rank computes FACTOR times as slowly for the whole run
  (a heterogeneous cluster; 2.0 is half speed): its measured forward and backward compute is
  followed by (FACTOR - 1) times as much busy compute.

The parsers raise ``argparse.ArgumentTypeError`` naming the flag and the expected form, so
argparse prints a usage error.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

STRAGGLER_KINDS = ("compute", "data", "sleep")


@dataclass(frozen=True)
class StepWindow:
    """Steps ``[start, end)``; ``end`` None means until the end of the run."""

    start: int = 0
    end: int | None = None

    def __contains__(self, step: object) -> bool:
        return (
            isinstance(step, int) and self.start <= step and (self.end is None or step < self.end)
        )


ALWAYS = StepWindow()


@dataclass(frozen=True)
class Straggler:
    rank: int
    kind: str
    amount_s: float
    window: StepWindow = ALWAYS


@dataclass(frozen=True)
class Jitter:
    ranks: tuple[int, ...]
    amount_s: float
    window: StepWindow = ALWAYS


@dataclass(frozen=True)
class SlowRank:
    rank: int
    factor: float


def _split_window(flag: str, text: str) -> tuple[str, StepWindow]:
    body, sep, window = text.partition("@")
    if not sep:
        return body, ALWAYS
    start_s, _, end_s = window.partition(":")
    try:
        start = int(start_s)
        end = int(end_s) if end_s.strip() else None
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{flag} {text!r}: the window must be @START:END or @START: (integer steps)"
        ) from None
    if start < 0 or (end is not None and end < start):
        raise argparse.ArgumentTypeError(f"{flag} {text!r}: need 0 <= START <= END")
    return body, StepWindow(start, end)


def parse_straggler(text: str) -> Straggler:
    body, window = _split_window("--straggler", text)
    parts = body.split(":")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(
            f"--straggler {text!r}: expected RANK:KIND:AMOUNT[@START:END]"
        )
    rank_s, kind, amount_s = parts
    if kind not in STRAGGLER_KINDS:
        raise argparse.ArgumentTypeError(
            f"--straggler {text!r}: KIND must be one of {', '.join(STRAGGLER_KINDS)}"
        )
    try:
        rank, amount = int(rank_s), float(amount_s)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--straggler {text!r}: RANK must be an int and AMOUNT seconds"
        ) from None
    if rank < 0 or not amount >= 0:
        raise argparse.ArgumentTypeError(f"--straggler {text!r}: RANK and AMOUNT must be >= 0")
    return Straggler(rank, kind, amount, window)


def parse_jitter(text: str) -> Jitter:
    body, window = _split_window("--jitter", text)
    try:
        ranks_s, amount_s = body.split(":")
        ranks = tuple(int(r) for r in ranks_s.split(",") if r.strip())
        amount = float(amount_s)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--jitter {text!r}: expected RANKS:AMOUNT[@START:END], e.g. 1,3:0.03@10:40"
        ) from None
    if not ranks or min(ranks) < 0 or not amount >= 0:
        raise argparse.ArgumentTypeError(f"--jitter {text!r}: need ranks >= 0 and AMOUNT >= 0")
    return Jitter(ranks, amount, window)


def parse_slow_rank(text: str) -> SlowRank:
    try:
        rank_s, factor_s = text.split(":")
        rank, factor = int(rank_s), float(factor_s)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--slow-rank {text!r}: expected RANK:FACTOR, e.g. 2:1.5"
        ) from None
    if rank < 0 or not factor >= 1.0:
        raise argparse.ArgumentTypeError(
            f"--slow-rank {text!r}: need RANK >= 0 and FACTOR >= 1 (2.0 is half speed)"
        )
    return SlowRank(rank, factor)


def check_ranks(
    parser: argparse.ArgumentParser,
    world: int,
    stragglers: Sequence[Straggler],
    jitters: Sequence[Jitter],
    slow_ranks: Sequence[SlowRank],
) -> None:
    """A usage error for a fault on a rank the job does not have (a typo would pass silently)."""
    for flag, ranks in (
        ("--straggler", [s.rank for s in stragglers]),
        ("--jitter", [r for j in jitters for r in j.ranks]),
        ("--slow-rank", [s.rank for s in slow_ranks]),
    ):
        bad = sorted(r for r in ranks if r >= world)
        if bad:
            parser.error(f"{flag}: rank {bad[0]} is not in a job of {world} ranks")


class RankFaults:
    """One rank's faults, asked per step."""

    def __init__(
        self,
        rank: int,
        stragglers: Sequence[Straggler],
        jitters: Sequence[Jitter],
        slow_ranks: Sequence[SlowRank],
        seed: int,
    ) -> None:
        self.stragglers = [s for s in stragglers if s.rank == rank]
        self.jitters = [j for j in jitters if rank in j.ranks]
        self.slow_factor = 1.0
        for slow in slow_ranks:
            if slow.rank == rank:
                self.slow_factor *= slow.factor
        # Its own stream: the training script seeds `random` identically on every rank.
        self._rng = random.Random(seed * 1000 + rank)

    def _amount(self, kind: str, step: int) -> float:
        return sum(s.amount_s for s in self.stragglers if s.kind == kind and step in s.window)

    def compute_s(self, step: int) -> float:
        """Busy compute inside forward this step: compute stragglers plus a jitter draw."""
        jitter = sum(self._rng.uniform(0, j.amount_s) for j in self.jitters if step in j.window)
        return self._amount("compute", step) + jitter

    def data_s(self, step: int) -> float:
        return self._amount("data", step)

    def sleep_s(self, step: int) -> float:
        return self._amount("sleep", step)


def busy_compute(seconds: float, device: torch.device) -> None:
    """Real arithmetic for ``seconds`` (a slow GPU/CPU, not an idle wait)."""
    if seconds <= 0:
        return
    a = torch.randn(128, 128, device=device)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class DirectReader:
    """Reads ``chunk`` bytes per batch from a file or block device, bypassing the page cache
    (``O_DIRECT``), at offsets that wrap around the file: storage a data loader really waits
    for, so a slow or throttled volume shows in the rank's fetch time and I/O counters."""

    ALIGN = 4096

    def __init__(self, path: Path, chunk: int) -> None:
        import mmap
        import os

        self._os = os
        self.chunk = max(self.ALIGN, chunk - chunk % self.ALIGN)
        flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
        self.fd = os.open(path, flags)
        self.size = os.lseek(self.fd, 0, os.SEEK_END)
        if self.size < self.chunk:
            os.close(self.fd)
            raise ValueError(f"{path}: {self.size} bytes, less than one read of {self.chunk}")
        # O_DIRECT wants an aligned buffer: anonymous mmap memory is page-aligned.
        self.buffer = mmap.mmap(-1, self.chunk)
        self.offset = 0

    def read(self) -> int:
        if self.offset + self.chunk > self.size:
            self.offset = 0
        n = self._os.preadv(self.fd, [self.buffer], self.offset)
        self.offset += self.chunk
        return n


class SlowCollate:
    """Default collation plus a wait the training loop sets per batch (the ``data`` fault),
    and a real read from storage per batch when a ``DirectReader`` is given."""

    def __init__(self, reader: DirectReader | None = None) -> None:
        self.delay_s = 0.0
        self.reader = reader

    def __call__(self, batch: list[tuple[torch.Tensor, torch.Tensor]]) -> object:
        if self.reader is not None:
            self.reader.read()
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return torch.utils.data.default_collate(batch)
