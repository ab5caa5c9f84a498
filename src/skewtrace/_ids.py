"""Trace and span IDs.

Every rank derives the same trace ID and step-root span ID from (job, step), so a step's
spans from all ranks land in one trace with no communication, and the ID of its own
``train.step`` span from (job, step, rank), so that the Collector's step summary can link to
any rank's step without having seen it (docs/architecture.md, trace shape). Every other span
ID comes from a private generator seeded from ``os.urandom``: training scripts call
``random.seed(0)`` on every rank, and IDs drawn from the shared ``random`` module would
collide across ranks.
"""

from __future__ import annotations

import hashlib
import os
import random


def _digest(kind: str, job_id: str, step: int) -> bytes:
    return hashlib.sha256(f"skewtrace/{kind}/{job_id}/{step}".encode()).digest()


def step_trace_id(job_id: str, step: int) -> int:
    """The trace ID of (job, step): first 16 bytes of sha256("skewtrace/trace/<job>/<step>")."""
    value = int.from_bytes(_digest("trace", job_id, step)[:16], "big")
    return value or 1


def step_root_span_id(job_id: str, step: int) -> int:
    """The step root span's ID: first 8 bytes of sha256("skewtrace/root/<job>/<step>")."""
    value = int.from_bytes(_digest("root", job_id, step)[:8], "big")
    return value or 1


def rank_step_span_id(job_id: str, step: int, rank: int) -> int:
    """A rank's ``train.step`` span ID: first 8 bytes of
    sha256("skewtrace/rankstep/<job>/<step>/<rank>"), 1 when that is all zeros."""
    value = int.from_bytes(
        hashlib.sha256(f"skewtrace/rankstep/{job_id}/{step}/{rank}".encode()).digest()[:8], "big"
    )
    return value or 1


class SpanIdGenerator:
    """Random 64-bit span IDs, independent of the ``random`` module's global state.

    Reseeded in a forked child so parent and child do not repeat each other's sequence.
    """

    def __init__(self) -> None:
        self._rng = random.Random(os.urandom(32))
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        self._rng = random.Random(os.urandom(32))

    def new_span_id(self) -> int:
        span_id = self._rng.getrandbits(64)
        while span_id == 0:
            span_id = self._rng.getrandbits(64)
        return span_id
