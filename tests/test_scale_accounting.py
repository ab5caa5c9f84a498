"""The accounting of benchmarks/scale.py: spans in = spans out + counted drops.

The fast tests feed the balance synthetic telemetry pages; the slow one sends a short
1024-rank job through the real two-tier gateway (tier 1 routing by trace ID to two tier-2
instances running barrierskew) and checks that every span the load generator had
acknowledged reached the sink or was counted dropped by a collector, hop by hop, and that
each step analyzed wrote one summary.
"""

from __future__ import annotations

import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from collector_harness import loadgen_for_tests, run_loadgen_send

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import scale
from collector_e2e import Sink


def _page(accepted: int, sent: int, **extra: int) -> str:
    lines = [
        f'otelcol_receiver_accepted_spans{{receiver="otlp",transport="grpc"}} {accepted}',
        f'otelcol_exporter_sent_spans{{exporter="otlp_grpc/backend"}} {sent}',
    ]
    for name, value in extra.items():
        lines.append(f"{name} {value}")
    return "\n".join(["# HELP x", *lines, ""])


def test_balance_holds_when_every_span_arrives() -> None:
    acc = scale.account(
        {"spans": 100, "rejected_spans": 0},
        {"spans": 100, "step_summaries": 2},
        [_page(100, 102, otelcol_processor_barrierskew_steps_analyzed=2)],
        [],
    )
    assert acc.lost_uncounted == 0
    assert acc.ok(), acc.hops


def test_counted_drops_balance_and_uncounted_loss_is_caught() -> None:
    dropped = scale.account(
        {"spans": 100},
        {"spans": 90, "step_summaries": 0},
        [_page(100, 90, otelcol_exporter_send_failed_spans=10)],
        [],
    )
    assert dropped.counted_drops == 10
    assert dropped.lost_uncounted == 0

    lost = scale.account({"spans": 100}, {"spans": 90}, [_page(100, 90)], [])
    assert lost.lost_uncounted == 10
    assert not lost.ok()


def test_a_hop_that_loses_spans_is_named() -> None:
    acc = scale.account(
        {"spans": 100},
        {"spans": 100},
        [_page(100, 100)],
        [_page(60, 60), _page(30, 40)],  # tier 2 accepted 90 of the 100 tier 1 sent
    )
    assert any("tier 2 accepted 90" in hop for hop in acc.hops), acc.hops
    assert not acc.ok()


@pytest.mark.slow
@pytest.mark.collector
def test_gateway_at_1024_ranks_loses_nothing_uncounted(otelcol_path: Path) -> None:
    loadgen = loadgen_for_tests()
    ranks, steps = 1024, 4
    sink = Sink(loadgen)
    try:
        with tempfile.TemporaryDirectory(prefix="skewtrace-scale-test-") as tmp:
            pipeline = scale.Pipeline(
                "gateway", otelcol_path, Path(tmp), sink.address, sink.address, 2, {}
            )
            with ExitStack() as stack:
                pipeline.start(stack)
                sent = run_loadgen_send(
                    loadgen, pipeline.first.otlp_grpc_endpoint,
                    "-ranks", str(ranks), "-steps", str(steps), "-collectives", "4",
                    "-tp", "8", "-pregenerate", "-job", "scale-accounting",
                    "-timeout", "60s",
                )  # fmt: skip
                assert sent["failed_requests"] == 0
                # Every span at the sink or counted (at 1024 ranks x 10 spans a step the
                # traceshape processor stores a sample: the rest is counted, not stored), and
                # the summaries, which follow the last spans by analysis_delay.
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    sink.wait_for(0, timeout_s=0)  # reads 2 s more of the sink's reports
                    acc = pipeline.account(sent, sink.last)
                    if acc.ok() and acc.steps_analyzed == steps and acc.summaries == steps:
                        break
                counts = sink.last
                acc = pipeline.account(sent, counts)
    finally:
        sink.close()
    # Per rank and step: train.step, four phases, 4 all-reduces, 1 all_gather; per step one
    # job-level root span.
    assert sent["spans"] == steps * (ranks * (5 + 4 + 1) + 1)
    assert acc.lost_uncounted == 0, acc
    # Nothing dropped but what traceshape did not store, by design.
    assert set(acc.dropped) <= {"traceshape not stored"}, acc.dropped
    assert acc.received < sent["spans"] / 4, "a 1024-rank job is stored as a sample"
    assert not acc.hops, acc.hops
    assert acc.steps_analyzed == steps
    assert acc.summaries == steps
