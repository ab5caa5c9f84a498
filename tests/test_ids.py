"""Trace/span ID derivation: deterministic per (job, step), random otherwise."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys

from skewtrace._ids import (
    SpanIdGenerator,
    rank_step_span_id,
    step_root_span_id,
    step_trace_id,
)


def test_trace_id_is_sha256_prefix_of_job_and_step() -> None:
    expected = int.from_bytes(hashlib.sha256(b"skewtrace/trace/job-7/12").digest()[:16], "big")
    assert step_trace_id("job-7", 12) == expected
    assert step_trace_id("job-7", 12) != step_trace_id("job-7", 13)
    assert step_trace_id("job-7", 12) != step_trace_id("job-8", 12)


def test_root_span_id_is_sha256_prefix_and_nonzero() -> None:
    expected = int.from_bytes(hashlib.sha256(b"skewtrace/root/job-7/0").digest()[:8], "big")
    assert step_root_span_id("job-7", 0) == expected
    assert all(step_root_span_id("j", step) != 0 for step in range(1000))


def test_rank_step_span_id_is_sha256_prefix_per_rank() -> None:
    """The Collector derives the same ID (spanio.RankStepSpanID) to link a summary to a rank."""
    expected = int.from_bytes(hashlib.sha256(b"skewtrace/rankstep/job-7/12/3").digest()[:8], "big")
    assert rank_step_span_id("job-7", 12, 3) == expected
    ids = {rank_step_span_id("job-7", 12, rank) for rank in range(4096)}
    assert len(ids) == 4096
    assert rank_step_span_id("job-7", 13, 3) != expected


def test_span_ids_ignore_the_global_random_seed() -> None:
    random.seed(0)
    first = [SpanIdGenerator().new_span_id() for _ in range(3)]
    random.seed(0)
    second = [SpanIdGenerator().new_span_id() for _ in range(3)]
    assert set(first).isdisjoint(second)


_CHILD = (
    "import random; random.seed(0); "
    "from skewtrace._ids import SpanIdGenerator; g = SpanIdGenerator(); "
    "print(' '.join(str(g.new_span_id()) for _ in range(50)))"
)


def test_identical_seeds_in_separate_processes_give_distinct_ids() -> None:
    """Two 'ranks' that seed random identically must not produce the same span IDs."""
    outputs = [
        subprocess.run(
            [sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True
        ).stdout.split()
        for _ in range(2)
    ]
    assert len(outputs[0]) == 50
    assert set(outputs[0]).isdisjoint(outputs[1])


def test_forked_child_does_not_repeat_parent_ids() -> None:
    generator = SpanIdGenerator()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_end)
        os.write(write_end, str(generator.new_span_id()).encode())
        os._exit(0)
    os.close(write_end)
    child_id = int(os.read(read_end, 64))
    os.waitpid(pid, 0)
    os.close(read_end)
    assert child_id != generator.new_span_id()
