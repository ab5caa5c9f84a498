"""What the framework examples share, none of it about tracing except ``one_call``.

- ``SLOW_RANK``/``SLOW_MS``/``SLOW_FROM_STEP``: that rank sleeps ``SLOW_MS`` in every forward
  from that step on (a slow GPU, as the spans see it: a longer forward).
- ``SKEWTRACE_ONE_CALL=1``: the script calls ``skewtrace.instrument(model=..., optimizer=...)``
  itself; otherwise it knows nothing of skewtrace (run it under ``opentelemetry-instrument``
  for zero-code tracing, or without for a plain run).
- ``COLLECTIVE_COUNTS_DIR``: at the end each rank writes how many collectives each of its process
  groups ran by the group's own count (``_get_sequence_number_for_group``), independent of
  skewtrace, to ``counts-<rank>.json`` there (in one-call mode, those after the call).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


class SlowRank:
    """Counts forwards; on the slow rank sleeps from the configured step on."""

    def __init__(self, forwards_per_step: int = 1) -> None:
        self.forwards = 0
        self.per_step = forwards_per_step
        slow = os.environ.get("SLOW_RANK")
        self.active = slow is not None and int(slow) == rank()
        self.delay_s = float(os.environ.get("SLOW_MS", "60")) / 1000.0
        self.from_step = int(os.environ.get("SLOW_FROM_STEP", "0"))

    def __call__(self) -> None:
        step = self.forwards // self.per_step
        self.forwards += 1
        if self.active and step >= self.from_step:
            time.sleep(self.delay_s)


# Each group's count when skewtrace.instrument() was called: what ran before is not traced.
_counted_before: dict[str, int] = {}


def one_call(model: Any = None, optimizer: Any = None) -> None:
    if os.environ.get("SKEWTRACE_ONE_CALL") == "1":
        import skewtrace

        _counted_before.update(_group_counts())
        skewtrace.instrument(model=model, optimizer=optimizer)


def _group_counts() -> dict[str, int]:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if not dist.is_initialized():
        return {}
    counts: dict[str, int] = {}
    for pg in list(c10d._world.pg_map):
        name = "default" if pg is c10d.GroupMember.WORLD else c10d._get_process_group_name(pg)
        try:
            counts[name] = int(pg._get_sequence_number_for_group())
        except Exception:
            continue
    return counts


def write_collective_counts() -> None:
    """Call before the process group is destroyed (see ``COLLECTIVE_COUNTS_DIR``)."""
    directory = os.environ.get("COLLECTIVE_COUNTS_DIR")
    if not directory:
        return
    counts = {name: count - _counted_before.get(name, 0) for name, count in _group_counts().items()}
    path = Path(directory) / f"counts-{rank()}.json"
    path.write_text(json.dumps(counts))


def init_distributed() -> Any:
    """``init_process_group`` (NCCL on GPUs, else gloo); returns the rank's device."""
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
        return device
    dist.init_process_group("gloo")
    return torch.device("cpu")
