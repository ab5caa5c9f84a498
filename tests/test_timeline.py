"""The timeline: change points, the first component to change, before/after, the watch service.

Unit tests feed series in memory (``MemorySource``); the end-to-end tests run a real
Prometheus scraping a prometheus_client exporter in this process whose series the test
changes over time, and call the ``skewtrace timeline`` CLI against it.
"""

from __future__ import annotations

import http.server
import json
import logging
import math
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.parser import text_string_to_metric_families

import otlp_sink
from conftest import free_port
from otlp_sink import OtlpSink
from prometheus_harness import PrometheusServer
from skewtrace import _ids, semconv
from skewtrace.timeline import command
from skewtrace.timeline.changepoint import (
    ZERO_BASELINE_RATIO,
    DetectorParams,
    counter_rate,
    detect,
)
from skewtrace.timeline.compare import TimeRange, compare
from skewtrace.timeline.first_change import Report, Settings, first_change
from skewtrace.timeline.prometheus_source import PrometheusError, PrometheusSource, promql
from skewtrace.timeline.service import SERVICE_NAME, WatchConfig, Watcher
from skewtrace.timeline.signals import (
    DEVICE,
    DISK_DIRECTION,
    GPU_UUID,
    HOST,
    IFACE,
    JOB,
    OP,
    PG,
    QDISC_KIND,
    RANK,
    STEP_COUNT,
    STEP_TIME,
    SWITCH,
)
from skewtrace.timeline.source import Form, MemorySource, Query

T0 = 1_760_000_000.0

# ----------------------------------------------------------------------------- change points


def _steps(levels: Sequence[tuple[int, float]], noise: float = 0.0, seed: int = 0) -> tuple[
    list[float], list[float]
]:  # fmt: skip
    """Times 0, 1, 2, ... and values: ``levels`` is [(samples, level), ...]."""
    rng = random.Random(seed)
    values = [level + rng.gauss(0, noise) for count, level in levels for _ in range(count)]
    return [float(i) for i in range(len(values))], values


def test_step_up_is_found_at_its_first_sample() -> None:
    times, values = _steps([(40, 1.0), (30, 2.0)], noise=0.03)
    change = detect(times, values)
    assert change is not None
    assert change.onset == 40.0
    assert change.ratio == pytest.approx(2.0, rel=0.05)
    assert change.direction == 1


def test_step_down_is_found() -> None:
    times, values = _steps([(30, 5.0), (20, 2.5)], noise=0.05, seed=3)
    change = detect(times, values)
    assert change is not None
    assert change.onset == 30.0
    assert change.ratio == pytest.approx(0.5, rel=0.05)
    assert detect(times, values, direction=1) is None


@pytest.mark.parametrize("seed", range(8))
def test_noise_alone_is_no_change(seed: int) -> None:
    rng = random.Random(seed)
    gaussian = [10 + rng.gauss(0, 1.0) for _ in range(300)]
    # Heavy tails: occasional outliers five times the usual spread.
    spiky = [10 + (rng.gauss(0, 5.0) if rng.random() < 0.03 else rng.gauss(0, 0.5))
             for _ in range(300)]  # fmt: skip
    times = [float(i) for i in range(300)]
    assert detect(times, gaussian) is None
    assert detect(times, spiky) is None


def test_zero_baseline_that_becomes_nonzero_is_a_change() -> None:
    times, values = _steps([(30, 0.0), (10, 3.0)])
    change = detect(times, values)
    assert change is not None
    assert change.onset == 30.0
    assert change.before == 0.0
    assert change.ratio == ZERO_BASELINE_RATIO


def test_one_spike_is_no_change() -> None:
    times, values = _steps([(60, 1.0)], noise=0.02)
    values[30] = 50.0
    assert detect(times, values) is None


def test_too_short_series_gives_none() -> None:
    times, values = _steps([(3, 1.0), (2, 5.0)])
    assert detect(times, values) is None
    assert detect([], []) is None


def test_nan_and_inf_are_skipped() -> None:
    times, values = _steps([(30, 1.0), (20, 3.0)], noise=0.02)
    for i in (5, 17, 29, 35):
        values[i] = math.nan
    values[10] = math.inf
    change = detect(times, values)
    assert change is not None
    assert change.onset == 30.0


def test_ramp_onset_is_where_the_ramp_starts() -> None:
    # What rate() over a 4-sample window makes of a step at t=40.
    times = [float(i) for i in range(70)]
    values = [1.0 if t < 40 else min(2.0, 1.0 + (t - 39) / 4) for t in times]
    change = detect(times, values)
    assert change is not None
    assert change.onset == 40.0


def test_onset_bounds_and_parameters() -> None:
    times, values = _steps([(30, 1.0), (30, 2.0)], noise=0.01)
    assert detect(times, values, not_before=31.0) is None
    assert detect(times, values, not_after=29.0) is None
    with pytest.raises(ValueError):
        DetectorParams(min_before=1)


def _windowed_rate(
    before: float,
    after: float,
    t0: float,
    window: int,
    length: int = 80,
    noise: float = 0.0,
    seed: int = 0,
) -> tuple[list[float], list[float]]:
    """What Prometheus's rate over ``window`` samples shows of a level that steps at ``t0``."""
    rng = random.Random(seed)
    times = [float(i) for i in range(length)]
    values = []
    for t in times:
        covered = min(max((t - t0) / window, 0.0), 1.0)  # the part of the window after t0
        values.append(before + (after - before) * covered + rng.gauss(0, noise))
    return times, values


@pytest.mark.parametrize("after", [4000.0, 60.0, 130.0], ids=["x40", "-40%", "+30%"])
def test_a_rate_windows_onset_is_the_step_whatever_its_size(after: float) -> None:
    """A rate over 4 s turns a step at t0 into a 4 s ramp. Walking back from the midpoint, a
    large change's onset lands near t0 and a small one's later; from the midpoint crossing
    less half the window, both land on t0 (this put a throttled volume's reads, down 40%,
    after the data loader's wait, up x40, on the fabric)."""
    times, values = _windowed_rate(100.0, after, t0=40.0, window=4, noise=0.5, seed=2)
    change = detect(times, values, smear_s=4.0)
    assert change is not None
    assert change.onset == pytest.approx(40.0, abs=0.5)


def test_a_smeared_small_change_is_dated_late_without_its_window() -> None:
    """The same small change read as a gauge (no window given) is dated later: the reason the
    window is passed."""
    times, values = _windowed_rate(100.0, 60.0, t0=40.0, window=4, noise=0.5, seed=2)
    change = detect(times, values)
    assert change is not None and change.onset >= 41.0


def test_counter_rate_handles_resets() -> None:
    times, rates = counter_rate([0, 1, 2, 3, 4], [0, 10, 20, 5, 15])
    assert times == [1, 2, 3, 4]
    assert rates == [10, 10, 5, 10]


# ---------------------------------------------------------------------------- first change

JOB_ID = "job-a"
NODES = {"node0": "leaf1", "node1": "leaf1", "node2": "leaf2", "node3": "leaf2"}


def _series(length: int, before: float, after: float, at: float | None, noise: float,
            rng: random.Random) -> tuple[list[float], list[float]]:  # fmt: skip
    times = [T0 + i for i in range(length)]
    values = [
        (after if at is not None and t - T0 >= at else before) + rng.gauss(0, noise) for t in times
    ]
    return times, values


class Job:
    """A four-rank job (rank r on node r) in a MemorySource; every series flat unless told."""

    def __init__(self, length: int = 200, seed: int = 0) -> None:
        self.length = length
        self.rng = random.Random(seed)
        self.source = MemorySource(job_label=JOB)

    def rank_labels(self, rank: int) -> dict[str, str]:
        host = f"node{rank}"
        return {JOB: JOB_ID, RANK: str(rank), HOST: host, SWITCH: NODES[host]}

    def add(self, metric: str, labels: dict[str, str], before: float, after: float | None = None,
            at: float | None = None, noise: float = 0.0) -> None:  # fmt: skip
        times, values = _series(
            self.length, before, before if after is None else after, at, noise, self.rng
        )
        self.source.add(metric, labels, times, values)

    def healthy(self, step_at: float | None, step_after: float = 1.0) -> None:
        """Step time 0.5 s (rising at ``step_at``), 2 steps a second; flat GPU, disk, qdisc,
        transfer (10 a step) and loader (1 batch a step)."""
        for rank in range(4):
            labels = self.rank_labels(rank)
            self.add(STEP_TIME.metric, labels, 0.5, step_after, step_at, noise=0.005)
            self.source.add(
                STEP_COUNT.metric, labels,
                [T0 + i for i in range(self.length)],
                [2.0 * i for i in range(self.length)],
            )  # fmt: skip
            self.add(semconv.PROM_GPU_UTILIZATION, {**labels, GPU_UUID: f"GPU-{rank}"}, 0.9,
                     noise=0.01)  # fmt: skip
            self.add(semconv.PROM_DATALOADER_WAIT, labels, 0.01, noise=0.0005)
            self.add(semconv.PROM_DATALOADER_FETCHES, labels, 2.0)  # one batch a step
            self.add(semconv.PROM_DISK_OPERATION_TIME, {**labels, DEVICE: "nvme0n1"}, 0.05,
                     noise=0.002)  # fmt: skip
            self.add(semconv.PROM_QDISC_DROPS, {**labels, IFACE: "eth0", QDISC_KIND: "tbf"}, 0.0)
        self.add(semconv.PROM_COLLECTIVE_TRANSFER, {JOB: JOB_ID, PG: "dp", OP: "all_reduce"},
                 0.01, noise=0.0002)  # fmt: skip
        # Ten all-reduces a step (the step count grows 2 a second).
        self.add(semconv.PROM_COLLECTIVE_TRANSFER + "_count",
                 {JOB: JOB_ID, PG: "dp", OP: "all_reduce"}, 20.0)  # fmt: skip

    def replace(self, metric: str, match: dict[str, str], before: float, after: float,
                at: float, noise: float = 0.0) -> None:  # fmt: skip
        stored = self.source._series[metric]
        for index, series in enumerate(stored):
            if all(series.labels.get(k) == v for k, v in match.items()):
                times, values = _series(self.length, before, after, at, noise, self.rng)
                stored[index] = type(series)(series.labels, times, values)
                return
        raise KeyError(match)

    def report(self) -> Report:
        return first_change(self.source, JOB_ID, T0, T0 + self.length - 1)

    def transfers_rise(self, at: float) -> None:
        """The job's all-reduces take 3.4x as long from ``at``: the collectives that cross
        the regressed ranks' links waited (the network is on the job's path)."""
        self.replace(semconv.PROM_COLLECTIVE_TRANSFER, {PG: "dp"}, 0.01, 0.034, at=at,
                     noise=0.0002)  # fmt: skip


def test_nic_drops_are_named_first_then_transfer_then_step() -> None:
    job = Job()
    job.healthy(step_at=108)
    job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node3"}, 0.0, 40.0, at=100)
    job.replace(semconv.PROM_COLLECTIVE_TRANSFER, {PG: "dp"}, 0.01, 0.034, at=102, noise=0.0002)
    report = job.report()

    assert report.regression is not None
    assert report.regression.onset == T0 + 108
    assert report.regression.ratio == pytest.approx(2.0, rel=0.05)
    assert report.regression.ranks == (0, 1, 2, 3)
    assert report.regression.step == 216  # the step count at the onset
    kinds = [(c.kind, c.component, c.onset - T0) for c in report.changes]
    assert kinds == [
        (semconv.COMPONENT_NIC, "node3/eth0", 100),
        (semconv.COMPONENT_COLLECTIVE, "dp", 102),
        (semconv.COMPONENT_STEP, JOB_ID, 108),
    ]
    first = report.changes[0]
    assert first.signal == "training.qdisc.drops{tbf}"
    assert first.order == 0 and report.changes[2].order == 2
    assert report.changes[1].ratio == pytest.approx(3.4, rel=0.05)
    summary = report.summary()
    assert summary.startswith("node3/eth0 training.qdisc.drops{tbf} from ")
    assert re.search(r"collective transfer dp \+2[34]\d% from", summary), summary
    assert "step time x2.0 from" in summary
    encoded = json.loads(json.dumps(report.to_json()))
    assert encoded["changes"][0]["component"] == "node3/eth0"


def test_a_nic_sampled_late_still_comes_before_the_transfers_it_slowed() -> None:
    """Node telemetry reads the qdisc once per interval; the transfers are timed by their
    spans. A NIC whose change shows two samples after the first slow transfer (one telemetry
    interval of sampling lag plus one of scrape phase) is still the first change; with no
    sampling lag allowed, the transfer would lead."""
    job = Job()
    job.healthy(step_at=106)
    job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node3"}, 0.0, 40.0, at=103)
    job.replace(semconv.PROM_COLLECTIVE_TRANSFER, {PG: "dp"}, 0.01, 0.034, at=101, noise=0.0002)

    report = job.report()
    assert [(c.kind, c.onset - T0) for c in report.changes][:2] == [
        (semconv.COMPONENT_NIC, 103),
        (semconv.COMPONENT_COLLECTIVE, 101),
    ]
    no_lag = first_change(
        job.source, JOB_ID, T0, T0 + job.length - 1, Settings(telemetry_interval_s=0.0)
    )
    assert no_lag.changes[0].kind == semconv.COMPONENT_COLLECTIVE


def test_dataloader_first_and_throughput_effects_after_it() -> None:
    job = Job(seed=1)
    job.healthy(step_at=101)
    job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "2"}, 0.01, 0.08, at=100, noise=0.003)
    # Every node's traffic falls as steps slow down: an effect, in the same interval (and a
    # stronger change, in baseline spreads, than the data loader's).
    for rank in range(4):
        job.add(semconv.PROM_NETWORK_IO, {**job.rank_labels(rank), IFACE: "eth0"}, 1e8, 2e7,
                at=100, noise=1e5)  # fmt: skip
    report = job.report()
    assert report.first is not None
    assert (report.first.kind, report.first.component) == (
        semconv.COMPONENT_DATALOADER,
        "node2/rank2",
    )
    # The job's transfers did not change: the NICs' traffic falling is off its path (and an
    # effect), listed apart and marked so.
    assert [c.kind for c in report.changes] == [
        semconv.COMPONENT_DATALOADER,
        semconv.COMPONENT_STEP,
    ]
    assert [c.kind for c in report.also_changed] == [semconv.COMPONENT_NIC] * 4
    assert all(c.effect for c in report.also_changed)
    encoded = report.to_json()
    assert [c["on_path"] for c in encoded["also_changed"]] == [False] * 4
    assert [c["effect"] for c in encoded["also_changed"]] == [True] * 4
    assert encoded["changes"][0]["effect"] is False and encoded["changes"][0]["on_path"]


def test_the_largest_of_several_step_rises_is_the_regression() -> None:
    """A host busy for a while (step time x1.3 at 60 s), then the fault (x2.6 at 140 s,
    node3's qdisc dropping from 135 s): the report explains the fault's rise, names the
    earlier one in its notes, and the busy period's changes are not its causes."""
    job = Job(length=220, seed=4)
    job.healthy(step_at=None)
    for rank in range(4):
        times = [T0 + i for i in range(job.length)]
        values = [
            (0.5 if i < 60 else 0.65 if i < 140 else 1.7) + job.rng.gauss(0, 0.005)
            for i in range(job.length)
        ]
        stored = job.source._series[STEP_TIME.metric]
        for index, series in enumerate(stored):
            if series.labels.get(RANK) == str(rank):
                stored[index] = type(series)(series.labels, times, values)
    job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node3"}, 0.0, 40.0, at=135)
    job.transfers_rise(at=137)
    report = job.report()
    assert report.regression is not None
    assert report.regression.onset == T0 + 140, report.regression
    assert report.first is not None
    assert (report.first.kind, report.first.component) == (semconv.COMPONENT_NIC, "node3/eth0")
    assert any("smaller step-time rise x1.3" in note for note in report.notes), report.notes


def test_a_data_stragglers_loader_is_named_though_only_its_peers_step_time_rose() -> None:
    """Rank 2 waits 200 ms more per batch before its step span starts: its peers' step time
    rises (they wait for it in the collectives), its own does not. Its loader is still the
    job's wait, and the first change."""
    job = Job(seed=5)
    job.healthy(step_at=None)
    for rank in (0, 1, 3):
        job.replace(STEP_TIME.metric, {RANK: str(rank)}, 0.5, 0.7, at=101, noise=0.002)
    job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "2"}, 0.01, 0.21, at=100, noise=0.003)
    report = job.report()
    assert report.regression is not None and 2 not in report.regression.ranks
    assert report.first is not None
    assert (report.first.kind, report.first.component) == (
        semconv.COMPONENT_DATALOADER,
        "node2/rank2",
    )


def test_disk_first() -> None:
    job = Job(seed=2)
    job.healthy(step_at=105)
    job.replace(semconv.PROM_DISK_OPERATION_TIME, {HOST: "node1"}, 0.05, 0.6, at=100, noise=0.002)
    job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "1"}, 0.01, 0.2, at=103, noise=0.0005)
    report = job.report()
    components = [(c.kind, c.component) for c in report.changes]
    assert components == [
        (semconv.COMPONENT_DISK, "node1/nvme0n1"),
        (semconv.COMPONENT_DATALOADER, "node1/rank1"),
        (semconv.COMPONENT_STEP, JOB_ID),
    ]
    assert report.changes[0].signal == "system.disk.operation_time"


def test_block_device_comes_before_the_ranks_own_io_in_one_interval() -> None:
    job = Job(seed=9)
    job.healthy(step_at=104)
    # A throttled volume: the device's reads and rank 1's reads fall in the same interval.
    job.add(semconv.PROM_DISK_IO, {**job.rank_labels(1), DEVICE: "loop7"}, 4e6, 1e6, at=100,
            noise=1e4)  # fmt: skip
    job.add(semconv.PROM_PROCESS_IO, job.rank_labels(1), 2e6, 1e5, at=100, noise=1e4)
    job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "1"}, 0.01, 0.2, at=100, noise=0.0005)
    report = job.report()
    assert [(c.kind, c.component) for c in report.changes] == [
        (semconv.COMPONENT_DISK, "node1/loop7"),
        (semconv.COMPONENT_DISK, "node1/rank1"),
        (semconv.COMPONENT_DATALOADER, "node1/rank1"),
        (semconv.COMPONENT_STEP, JOB_ID),
    ]


def test_nodes_behind_one_switch_changing_together_name_the_switch() -> None:
    job = Job(seed=3)
    job.healthy(step_at=106)
    job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node0"}, 0.0, 30.0, at=100)
    job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node1"}, 0.0, 25.0, at=100)
    job.transfers_rise(at=102)
    report = job.report()
    first = report.first
    assert first is not None
    assert (first.kind, first.component) == (semconv.COMPONENT_SWITCH, "leaf1")
    assert first.members == ("node0/eth0", "node1/eth0")
    assert [c.kind for c in report.changes] == [
        semconv.COMPONENT_SWITCH,
        semconv.COMPONENT_COLLECTIVE,
        semconv.COMPONENT_STEP,
    ]


def test_one_node_of_a_switch_is_not_the_switch() -> None:
    job = Job(seed=4)
    job.healthy(step_at=106)
    job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node0"}, 0.0, 30.0, at=100)
    job.transfers_rise(at=102)
    report = job.report()
    assert report.first is not None
    assert (report.first.kind, report.first.component) == (semconv.COMPONENT_NIC, "node0/eth0")


def test_sporadic_retransmits_are_no_change_and_a_stream_of_them_is() -> None:
    """An event counter under one event per query step (here 1 s) on both sides is sporadic:
    not a change, however large its ratio from zero; a sustained stream of them is one."""
    job = Job(seed=5)
    job.healthy(step_at=102)
    job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "1"}, 0.01, 0.08, at=100, noise=0.003)
    job.add(semconv.PROM_TCP_RETRANSMITS, job.rank_labels(1), 0.0, 0.3, at=95)
    report = job.report()
    assert [(c.kind, c.component) for c in report.changes] == [
        (semconv.COMPONENT_DATALOADER, "node1/rank1"),
        (semconv.COMPONENT_STEP, JOB_ID),
    ]
    assert report.also_changed == ()

    job = Job(seed=5)
    job.healthy(step_at=102)
    job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "1"}, 0.01, 0.08, at=100, noise=0.003)
    job.add(semconv.PROM_TCP_RETRANSMITS, job.rank_labels(1), 0.0, 40.0, at=95)
    report = job.report()
    # A change, but off the job's path: the data loader waited, no collective did.
    assert [(c.kind, c.component) for c in report.also_changed] == [
        (semconv.COMPONENT_HOST, "node1")
    ]
    job.transfers_rise(at=97)
    report = job.report()
    assert report.first is not None
    assert (report.first.kind, report.first.component) == (semconv.COMPONENT_HOST, "node1")


def test_a_signal_that_got_better_is_an_effect_not_the_first_change() -> None:
    """A qdisc's overlimits falling (less traffic comes as steps slow) a second before the
    data loader's wait rises is ordered after it, like the throughput figures."""
    job = Job(seed=6)
    job.healthy(step_at=102)
    job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "1"}, 0.01, 0.08, at=100, noise=0.003)
    job.add(semconv.PROM_QDISC_OVERLIMITS, {**job.rank_labels(1), IFACE: "eth0",
            QDISC_KIND: "tbf"}, 500.0, 200.0, at=99, noise=5.0)  # fmt: skip
    job.transfers_rise(at=101)
    report = job.report()
    assert [(c.kind, c.component) for c in report.changes] == [
        (semconv.COMPONENT_DATALOADER, "node1/rank1"),
        (semconv.COMPONENT_COLLECTIVE, "dp"),
        (semconv.COMPONENT_NIC, "node1/eth0"),
        (semconv.COMPONENT_STEP, JOB_ID),
    ]
    assert report.changes[2].effect
    # The same change the other way (overlimits rising) is a cause, and first.
    job = Job(seed=6)
    job.healthy(step_at=102)
    job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "1"}, 0.01, 0.08, at=100, noise=0.003)
    job.add(semconv.PROM_QDISC_OVERLIMITS, {**job.rank_labels(1), IFACE: "eth0",
            QDISC_KIND: "tbf"}, 200.0, 500.0, at=99, noise=5.0)  # fmt: skip
    job.transfers_rise(at=101)
    report = job.report()
    assert report.first is not None
    assert (report.first.kind, report.first.component) == (semconv.COMPONENT_NIC, "node1/eth0")


def test_immaterial_changes_are_passed_over_for_the_material_one() -> None:
    """Seen on the fabric: twenty seconds before a throttled volume slowed the steps, rank 1's
    data-loader wait rose from 1.2 to 1.9 ms per batch and rank 0 began writing 1.3 KB/s.
    Neither can explain the step's rise: the wait's later, material rise is its change, the
    writes are none, and the volume's reads are named first."""
    job = Job(seed=7)
    job.healthy(step_at=104, step_after=0.62)
    job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "1"}, 0.0012, 0.0019, at=80, noise=0.00002)
    stored = job.source._series[semconv.PROM_DATALOADER_WAIT]
    for index, series in enumerate(stored):
        if series.labels.get(RANK) == "1":  # and then the volume's throttle: +55 ms
            values = [v + (0.055 if t - T0 >= 104 else 0.0) for t, v in
                      zip(series.times, series.values, strict=True)]  # fmt: skip
            stored[index] = type(series)(series.labels, series.times, values)
    job.add(semconv.PROM_PROCESS_IO, {**job.rank_labels(0), DISK_DIRECTION: "write"}, 0.0,
            1365.0, at=82)  # fmt: skip
    job.add(semconv.PROM_DISK_IO, {**job.rank_labels(1), DEVICE: "loop0"}, 1.6e7, 8e6, at=104,
            noise=1e4)  # fmt: skip
    report = job.report()
    assert [(c.kind, c.component, c.onset - T0) for c in report.changes] == [
        (semconv.COMPONENT_DISK, "node1/loop0", 104),
        (semconv.COMPONENT_DATALOADER, "node1/rank1", 104),
        (semconv.COMPONENT_STEP, JOB_ID, 104),
    ]


def test_a_collective_transfer_counts_by_the_collectives_of_a_step() -> None:
    """A transfer 2 ms slower per all-reduce is 20 ms a step at ten a step: material against a
    250 ms rise (5% is 12.5 ms) and named; at one all-reduce a step it is 2 ms, and passed over."""
    for per_step, named in ((10, True), (1, False)):
        job = Job(seed=10)
        job.healthy(step_at=102, step_after=0.75)
        job.replace(semconv.PROM_COLLECTIVE_TRANSFER, {PG: "dp"}, 0.010, 0.012, at=100,
                    noise=0.0001)  # fmt: skip
        job.replace(semconv.PROM_COLLECTIVE_TRANSFER + "_count", {PG: "dp"}, 2.0 * per_step,
                    2.0 * per_step, at=0)  # fmt: skip
        kinds = [c.kind for c in job.report().changes]
        assert (semconv.COMPONENT_COLLECTIVE in kinds) is named, (per_step, kinds)


def test_a_throttled_volume_comes_before_the_loader_it_slows_in_windowed_rates() -> None:
    """Rates over a 4 s window: the volume's reads fall 40% and the loader's wait rises x20 at
    the same moment. Both are dated to it, and the block device leads (it feeds the loader)."""
    job = Job(seed=11)
    job.source.window_s = 4.0
    job.healthy(step_at=104)

    def windowed(metric: str, labels: dict[str, str], before: float, after: float) -> None:
        times, values = _windowed_rate(before, after, t0=100.0, window=4, length=job.length,
                                       noise=abs(before) * 0.005, seed=11)  # fmt: skip
        job.source.add(metric, labels, [T0 + t for t in times], values)

    windowed(semconv.PROM_DISK_IO, {**job.rank_labels(1), DEVICE: "loop0"}, 1.3e7, 8e6)
    stored = job.source._series[semconv.PROM_DATALOADER_WAIT]
    stored[:] = [x for x in stored if x.labels.get(RANK) != "1"]
    windowed(semconv.PROM_DATALOADER_WAIT, job.rank_labels(1), 0.002, 0.04)
    report = job.report()
    assert [(c.kind, c.component) for c in report.changes][:2] == [
        (semconv.COMPONENT_DISK, "node1/loop0"),
        (semconv.COMPONENT_DATALOADER, "node1/rank1"),
    ]
    assert report.changes[0].onset - T0 == pytest.approx(100.0, abs=0.6)


def test_fewer_writes_on_the_host_disk_are_not_the_first_change() -> None:
    """Seen on the fabric: the host's root disk wrote 19 KB/s, then 1.3 KB/s, twenty seconds
    before a slow data loader. Fewer writes cannot slow a job; more could (named first) when
    they come with the loader's wait, not twenty seconds before it (then they are listed apart:
    the two-faults run on the fabric once had a disk change ten seconds before the NIC fault
    named first through a loader wait that rose with the second fault, 10 s later)."""
    for before, after, at, first, apart in (
        (19000.0, 1365.0, 80, semconv.COMPONENT_DATALOADER, ["node1/vda"]),
        (19000.0, 400000.0, 97, semconv.COMPONENT_DISK, []),
        (19000.0, 400000.0, 80, semconv.COMPONENT_DATALOADER, ["node1/vda"]),
    ):
        job = Job(seed=12)
        job.healthy(step_at=102)
        job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "1"}, 0.01, 0.08, at=100, noise=0.003)
        job.add(semconv.PROM_DISK_IO, {**job.rank_labels(1), DEVICE: "vda",
                DISK_DIRECTION: "write"}, before, after, at=at, noise=50.0)  # fmt: skip
        report = job.report()
        assert report.first is not None and report.first.kind == first, report.summary()
        assert [c.component for c in report.also_changed] == apart, report.also_changed


def test_a_busy_disk_of_ranks_that_read_nothing_is_apart_from_their_loader_wait() -> None:
    """As the fabric's data-loader run had it beside another job: node1's disk starts writing
    600 MB/s three seconds before rank 1's loader waits 100 ms more a batch, and the Collector
    flags rank 1 for its data. No rank reads from storage (their ``process.io`` reads stay at
    zero): the disk is listed apart and the loader leads. Where rank 1 reads from it, the same
    disk leads (it may be what the loader waited on)."""
    for reads, first, apart in (
        (0.0, (semconv.COMPONENT_DATALOADER, "node1/rank1"), ["node1/vda"]),
        (2e6, (semconv.COMPONENT_DISK, "node1/vda"), []),
    ):
        job = Job(seed=24)
        job.healthy(step_at=102)
        job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "1"}, 0.01, 0.11, at=100, noise=0.003)
        job.add(semconv.PROM_DISK_IO, {**job.rank_labels(1), DEVICE: "vda",
                DISK_DIRECTION: "write"}, 0.0, 6e8, at=97)  # fmt: skip
        for rank in range(4):
            job.add(semconv.PROM_PROCESS_IO, {**job.rank_labels(rank), DISK_DIRECTION: "read"},
                    reads if rank == 1 else 0.0, noise=reads * 0.01)  # fmt: skip
        _flag(job, 1, semconv.CAUSE_DATA, at=103)
        job.add(semconv.PROM_RANK_COST, job.rank_labels(1), 0.0, 0.1, at=103)
        report = job.report()
        assert report.first is not None, report.summary()
        assert (report.first.kind, report.first.component) == first, report.summary()
        assert [c.component for c in report.also_changed] == apart, report.also_changed


def test_an_effect_long_before_the_cause_still_follows_it() -> None:
    """A qdisc backlog that fell to zero twenty seconds before the data loader slowed (it got
    better, so it is an effect) is listed after the data loader, not first."""
    job = Job(seed=8)
    job.healthy(step_at=102)
    job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "1"}, 0.01, 0.08, at=100, noise=0.003)
    job.add(semconv.PROM_QDISC_BACKLOG, {**job.rank_labels(2), IFACE: "eth0", QDISC_KIND: "tbf"},
            3000.0, 0.0, at=80)  # fmt: skip
    job.transfers_rise(at=101)
    report = job.report()
    assert [(c.kind, c.component) for c in report.changes] == [
        (semconv.COMPONENT_DATALOADER, "node1/rank1"),
        (semconv.COMPONENT_COLLECTIVE, "dp"),
        (semconv.COMPONENT_NIC, "node2/eth0"),
        (semconv.COMPONENT_STEP, JOB_ID),
    ]
    assert report.changes[2].effect


# ------------------------------------------- on the job's path, and the Collector's verdicts

CAUSE = semconv.prometheus_label(semconv.STRAGGLER_CAUSE)
SUSPECT_KIND = semconv.prometheus_label(semconv.SUSPECT_KIND)
SUSPECT_NAME = semconv.prometheus_label(semconv.SUSPECT_NAME)


def _flag(job: Job, rank: int, cause: str, at: float) -> None:
    """The Collector's straggler gauge for ``rank`` with ``cause``, 1 from ``at``."""
    job.add(semconv.PROM_STRAGGLER, {**job.rank_labels(rank), CAUSE: cause}, 0.0, 1.0, at=at)


def test_a_disk_nobody_read_from_is_also_changed_not_first() -> None:
    """Issue 25: node3's disk gets busy 5 s before node1's NIC starts dropping and the job's
    transfers slow. No rank read from that disk (no data-loader wait, no process I/O rose):
    it is listed apart, and the NIC leads."""
    job = Job(seed=11)
    job.healthy(step_at=106)
    job.replace(semconv.PROM_DISK_OPERATION_TIME, {HOST: "node3"}, 0.05, 0.6, at=95, noise=0.002)
    job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node1"}, 0.0, 40.0, at=100)
    job.transfers_rise(at=102)
    report = job.report()
    assert report.first is not None
    assert (report.first.kind, report.first.component) == (semconv.COMPONENT_NIC, "node1/eth0")
    assert report.first.why == "the job's collective transfers rose"
    assert [(c.kind, c.component) for c in report.also_changed] == [
        (semconv.COMPONENT_DISK, "node3/nvme0n1")
    ]
    assert report.also_changed[0].onset - T0 == 95
    assert report.agrees is None  # the Collector flagged nothing here


def test_a_compute_straggler_names_no_infrastructure_and_agrees_with_the_collector() -> None:
    """As the issue saw on the fabric: every node's disk writes take longer 14 s before rank
    2's compute slows the job; no rank waited on a disk, no collective's transfer rose. No
    infrastructure component is a cause; the Collector's verdict (rank 2, compute) agrees."""
    job = Job(seed=12)
    job.healthy(step_at=110)
    for host in NODES:
        job.replace(semconv.PROM_DISK_OPERATION_TIME, {HOST: host}, 0.05, 0.3, at=96,
                    noise=0.002)  # fmt: skip
    _flag(job, 2, semconv.CAUSE_COMPUTE, at=113)
    job.add(semconv.PROM_RANK_COST, job.rank_labels(2), 0.0, 0.45, at=113)
    job.add(semconv.PROM_JOB_SLOWDOWN, {JOB: JOB_ID}, 1.0, 1.9, at=113)
    report = job.report()
    assert [c.kind for c in report.changes] == [semconv.COMPONENT_STEP]
    assert report.first_cause is None
    assert sorted(c.component for c in report.also_changed) == [
        f"{h}/nvme0n1" for h in sorted(NODES)
    ]
    assert report.agrees is True, report.agreement
    assert "rank 2 compute (on node2, 450 ms per step)" in report.agreement
    encoded = report.to_json()["diagnosis"]
    assert encoded["agrees"] is True
    assert encoded["flagged"] == [
        {
            "rank": 2,
            "host": "node2",
            "switch": "leaf2",
            "cause": semconv.CAUSE_COMPUTE,
            "cost_s": 0.45,
        }
    ]
    assert encoded["slowdown"] == 1.9


def test_an_immaterial_flag_beside_a_compute_straggler_still_agrees() -> None:
    """As the fabric's compute run once had it under load: the Collector flags rank 2 for
    compute (450 ms a step) and, for a while, rank 1 for its network at 6 ms a step. No
    component changed; the report agrees (rank 1's flag is no material share of the rise)."""
    job = Job(seed=23)
    job.healthy(step_at=110)
    _flag(job, 2, semconv.CAUSE_COMPUTE, at=113)
    job.add(semconv.PROM_RANK_COST, job.rank_labels(2), 0.0, 0.45, at=113)
    _flag(job, 1, semconv.CAUSE_NETWORK, at=120)
    job.add(semconv.PROM_RANK_COST, job.rank_labels(1), 0.0, 0.006, at=120)
    report = job.report()
    assert report.first_cause is None
    assert report.agrees is True, report.agreement
    assert "rank 1 network" in report.agreement  # shown, not weighed


def test_a_compute_straggler_flagged_for_its_network_a_moment_still_agrees() -> None:
    """As the fabric's compute run had it beside another job: the Collector flags rank 2 for
    compute from the fault on and, for five samples, for its network too (another process
    took its CPU while it sent). The rank's cost is its whole cost, whatever the cause; the
    network flag held for 5 of the compute flag's 87 samples and is no verdict of the window.
    Held as long as the compute flag, it is one, and the report differs."""
    for network_samples, agrees in ((5, True), (60, False)):
        job = Job(seed=25)
        job.healthy(step_at=110)
        _flag(job, 2, semconv.CAUSE_COMPUTE, at=113)
        job.add(semconv.PROM_RANK_COST, job.rank_labels(2), 0.0, 0.45, at=113)
        times = [T0 + i for i in range(job.length)]
        flagged = [1.0 if 130 <= i < 130 + network_samples else 0.0 for i in range(job.length)]
        network = {**job.rank_labels(2), CAUSE: semconv.CAUSE_NETWORK}
        job.source.add(semconv.PROM_STRAGGLER, network, times, flagged)
        report = job.report()
        assert report.first_cause is None, report.summary()
        assert report.agrees is agrees, report.agreement
        assert "rank 2 network" in report.agreement  # shown either way


def test_a_compute_stragglers_nic_suspected_for_a_moment_before_its_fault_still_agrees() -> None:
    """The fabric's compute-busy-disk run beside a CPU hog (2026-12-06, 12:40, replayed from
    its Prometheus data): 12 s before rank 2's compute fault, with the disk writer and the hog
    taking the CPUs, the Collector flagged ranks 0 and 2 for their network at 6 ms a step and
    suspected their NICs, one sample each; from the fault on, rank 2 for compute at 103 ms a
    step (22 samples). The network flag's cost is the rank's while it was flagged (6 ms, not
    the compute fault's 103), and a NIC counts only where a rank behind it is flagged for
    its network materially: the report agrees."""
    job = Job(seed=26)
    job.healthy(step_at=110)
    times = [T0 + i for i in range(job.length)]

    def series(metric: str, labels: dict[str, str], value) -> None:
        job.source.add(metric, labels, times, [value(i) for i in range(job.length)])

    def moment(i: int) -> float:  # one sample, 12 s before the fault
        return 1.0 if i == 98 else 0.0

    _flag(job, 2, semconv.CAUSE_COMPUTE, at=113)
    series(
        semconv.PROM_RANK_COST,
        job.rank_labels(2),
        lambda i: 0.45 if i >= 113 else 0.006 if i >= 98 else 0.0,
    )
    series(semconv.PROM_STRAGGLER, {**job.rank_labels(2), CAUSE: semconv.CAUSE_NETWORK}, moment)
    series(semconv.PROM_STRAGGLER, {**job.rank_labels(0), CAUSE: semconv.CAUSE_NETWORK}, moment)
    series(semconv.PROM_RANK_COST, job.rank_labels(0), lambda i: 0.006 if i >= 98 else 0.0)
    for host in ("node0", "node2"):
        nic = {JOB: JOB_ID, SUSPECT_KIND: "nic", SUSPECT_NAME: "eth0", HOST: host}
        series(semconv.PROM_FABRIC_SUSPECT, nic, moment)
    report = job.report()
    assert report.first_cause is None, report.summary()
    assert report.agrees is True, report.agreement
    assert "rank 2 network (on node2, 6 ms per step)" in report.agreement
    assert "rank 2 compute (on node2, 450 ms per step)" in report.agreement


def test_the_collectors_suspect_puts_a_link_on_the_path_and_agrees() -> None:
    """The Collector suspects node1's NIC; its qdisc dropped first. Agreed, with the suspect
    named as the reason the NIC is on the job's path (even before any transfer series moved)."""
    job = Job(seed=13)
    job.healthy(step_at=106)
    job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node1"}, 0.0, 40.0, at=100)
    job.add(semconv.PROM_FABRIC_SUSPECT, {JOB: JOB_ID, SUSPECT_KIND: "nic", SUSPECT_NAME: "eth0",
            HOST: "node1"}, 0.0, 1.0, at=108)  # fmt: skip
    report = job.report()
    assert report.first is not None and report.first.component == "node1/eth0"
    assert report.first.why == "the Collector suspects nic:node1/eth0"
    assert report.agrees is True, report.agreement


def test_where_the_collector_located_the_slow_link_other_nics_are_not_on_the_path() -> None:
    """As the fabric's NIC run once had it: node2's NIC is throttled, the Collector suspects
    it and flags rank 2 (180 ms per step) and, briefly, rank 0 for its network (6 ms per step);
    node0's queue holds packets back earlier than node2's change shows, because the job's
    traffic changed shape. node0's NIC is also changed, not first: the collectives' slow
    transfers were located on node2, rank 0's flag is no material share of the rise, and
    node0's NIC was suspected for a moment only."""

    def queues_fill() -> Job:
        job = Job(seed=19)
        job.healthy(step_at=106)
        job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node0"}, 0.0, 40.0, at=98)
        job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node2"}, 0.0, 40.0, at=101)
        job.transfers_rise(at=103)
        return job

    job = queues_fill()
    job.add(semconv.PROM_FABRIC_SUSPECT, {JOB: JOB_ID, SUSPECT_KIND: "nic", SUSPECT_NAME: "eth0",
            HOST: "node2"}, 0.0, 1.0, at=108)  # fmt: skip
    _flag(job, 2, semconv.CAUSE_NETWORK, at=108)
    job.add(semconv.PROM_RANK_COST, job.rank_labels(2), 0.0, 0.18, at=108)
    _flag(job, 0, semconv.CAUSE_NETWORK, at=108)
    job.add(semconv.PROM_RANK_COST, job.rank_labels(0), 0.0, 0.006, at=108)
    # node0's NIC suspected too, for the window's last 4 samples (node2's: 92).
    job.add(semconv.PROM_FABRIC_SUSPECT, {JOB: JOB_ID, SUSPECT_KIND: "nic", SUSPECT_NAME: "eth0",
            HOST: "node0"}, 0.0, 1.0, at=196)  # fmt: skip
    report = job.report()
    assert report.first is not None and report.first.component == "node2/eth0", report.summary()
    assert [c.component for c in report.also_changed] == ["node0/eth0"]
    assert report.agrees is True, report.agreement

    # Without the Collector's location, the job's rising transfers put every NIC on the path,
    # and node0's earlier change leads.
    unlocated = queues_fill().report()
    assert unlocated.first is not None and unlocated.first.component == "node0/eth0"
    assert unlocated.also_changed == ()


def test_a_disk_of_ranks_that_read_less_is_not_on_the_path() -> None:
    """As the fabric's volume run once had it under load: rank 1's volume is throttled and its
    loader waits; node2's root disk reads change with it (one kernel) and rank 2 reads less a
    second (its steps slowed). node2's disk is listed apart: rank 2 reads less, which adds no
    load to it, and no rank of node2 waited for its batches."""
    job = Job(seed=21)
    job.healthy(step_at=102)
    job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "1"}, 0.01, 0.2, at=100, noise=0.0005)
    job.add(semconv.PROM_DISK_OPERATIONS, {**job.rank_labels(1), DEVICE: "loop0",
            DISK_DIRECTION: "read"}, 400.0, 100.0, at=100, noise=2.0)  # fmt: skip
    job.add(semconv.PROM_DISK_OPERATIONS, {**job.rank_labels(2), DEVICE: "vda",
            DISK_DIRECTION: "read"}, 40.0, 10.0, at=99, noise=0.5)  # fmt: skip
    job.add(semconv.PROM_PROCESS_IO, {**job.rank_labels(2), DISK_DIRECTION: "read"},
            4e6, 1e6, at=101, noise=1e4)  # fmt: skip
    report = job.report()
    assert report.first is not None and report.first.component == "node1/loop0", report.summary()
    apart = {c.component for c in report.also_changed}
    assert "node2/vda" in apart, report.also_changed


def test_a_nic_suspected_for_ranks_that_cost_nothing_is_not_on_the_path() -> None:
    """As the fabric's data-loader run once had it under load: rank 1's loader slows the job
    by 100 ms a step; the Collector also suspects node0's NIC, behind which it flagged rank 0
    for its network at 4 ms a step. node0's TCP stack, changed first, is listed apart."""
    job = Job(seed=22)
    job.healthy(step_at=102)
    job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "1"}, 0.01, 0.2, at=100, noise=0.0005)
    job.add(semconv.PROM_TCP_RETRANSMITS, job.rank_labels(0), 0.0, 30.0, at=97)
    job.add(semconv.PROM_FABRIC_SUSPECT, {JOB: JOB_ID, SUSPECT_KIND: "nic", SUSPECT_NAME: "eth0",
            HOST: "node0"}, 0.0, 1.0, at=104)  # fmt: skip
    _flag(job, 0, semconv.CAUSE_NETWORK, at=104)
    job.add(semconv.PROM_RANK_COST, job.rank_labels(0), 0.0, 0.004, at=104)
    _flag(job, 1, semconv.CAUSE_DATA, at=104)
    job.add(semconv.PROM_RANK_COST, job.rank_labels(1), 0.0, 0.19, at=104)
    report = job.report()
    assert report.first is not None and report.first.kind == semconv.COMPONENT_DATALOADER, (
        report.summary()
    )
    assert [c.component for c in report.also_changed] == ["node0"], report.also_changed


def test_a_first_change_the_collector_does_not_conclude_shows_both() -> None:
    """The timeline's first change is node1's NIC, the Collector flags rank 3 for compute:
    they differ, and the report says both."""
    job = Job(seed=14)
    job.healthy(step_at=106)
    job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node1"}, 0.0, 40.0, at=100)
    job.transfers_rise(at=102)
    _flag(job, 3, semconv.CAUSE_COMPUTE, at=109)
    report = job.report()
    assert report.agrees is False
    assert "node1/eth0" in report.agreement and "rank 3 compute" in report.agreement


def test_a_stage_imbalance_is_no_components_doing_and_agrees() -> None:
    """Issue 21's verdicts in the timeline: the Collector flags stage 3 as imbalanced (its
    training.imbalance gauge); no component changed, and the report agrees."""
    job = Job(seed=18)
    job.healthy(step_at=108)
    job.add(semconv.PROM_IMBALANCE, {JOB: JOB_ID, CAUSE: semconv.CAUSE_STAGE_IMBALANCE,
            semconv.prometheus_label(semconv.PIPELINE_STAGE): "3"}, 0.0, 1.0, at=112)  # fmt: skip
    report = job.report()
    assert report.first_cause is None
    assert report.agrees is True and "stage 3 imbalanced" in report.agreement
    assert report.to_json()["diagnosis"]["imbalances"] == [
        {"cause": semconv.CAUSE_STAGE_IMBALANCE, "stage": "3"}
    ]


def test_two_faults_the_earlier_comes_first() -> None:
    """node1's volume slows rank 1's loader from 96 s; node3's NIC drops from 101 s and the
    transfers slow: both on the path, the earlier first."""
    job = Job(seed=15)
    job.healthy(step_at=106)
    job.replace(semconv.PROM_DISK_OPERATION_TIME, {HOST: "node1"}, 0.05, 0.6, at=96, noise=0.002)
    job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "1"}, 0.01, 0.2, at=98, noise=0.0005)
    job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node3"}, 0.0, 40.0, at=101)
    job.transfers_rise(at=103)
    report = job.report()
    assert [(c.kind, c.component) for c in report.changes] == [
        (semconv.COMPONENT_DISK, "node1/nvme0n1"),
        (semconv.COMPONENT_DATALOADER, "node1/rank1"),
        (semconv.COMPONENT_NIC, "node3/eth0"),
        (semconv.COMPONENT_COLLECTIVE, "dp"),
        (semconv.COMPONENT_STEP, JOB_ID),
    ]
    assert report.also_changed == ()


def _halve_step_rate(job: Job, at: float) -> None:
    """Every rank's cumulative step count grows 2 a second, then 1 from ``at`` (steps twice as
    long)."""
    stored = job.source._series[STEP_COUNT.metric]
    for index, series in enumerate(stored):
        counts, total = [], 0.0
        for i in range(job.length):
            counts.append(total)
            total += 2.0 if i < at else 1.0
        stored[index] = type(series)(series.labels, series.times, counts)


def test_work_per_step_tells_a_counter_that_moved_with_the_steps_from_a_cause() -> None:
    """Issue 25, work per step: node1's queue holds packets back 25% less often a second from
    99 s, as the steps take twice as long from 102 s: read per second it got better (an
    effect, by the direction rule), read per step it holds packets back 1.5x as often: a
    cause, and with the job's transfers slower, the first change. A queue whose overlimits
    per step held (they fell exactly with the steps) stays an effect."""
    for after, per_step, cause in ((300.0, 1.5, True), (200.0, 1.0, False)):
        job = Job(seed=16)
        job.healthy(step_at=102)
        _halve_step_rate(job, at=102)
        job.add(semconv.PROM_QDISC_OVERLIMITS, {**job.rank_labels(1), IFACE: "eth0",
                QDISC_KIND: "tbf"}, 400.0, after, at=99, noise=2.0)  # fmt: skip
        job.transfers_rise(at=103)
        report = job.report()
        queue = next(c for c in report.changes if c.component == "node1/eth0")
        assert queue.per_step_ratio == pytest.approx(per_step, rel=0.1), queue
        assert queue.effect is not cause, queue
        assert (report.first is queue) is cause, report.changes
        encoded = report.to_json()["changes"][report.changes.index(queue)]
        assert encoded["per_step_ratio"] == queue.per_step_ratio


def test_a_volume_read_less_stays_a_cause_though_its_reads_per_step_held() -> None:
    """Where either direction can hurt (a volume's reads), a level per step that held says
    nothing (a throttled volume slows the reads and the steps alike): the direction rule
    stands, and the volume, read less from 99 s, comes before the loader that waits on it."""
    job = Job(seed=16)
    job.healthy(step_at=102)
    _halve_step_rate(job, at=102)
    job.replace(semconv.PROM_DATALOADER_WAIT, {RANK: "1"}, 0.01, 0.2, at=100, noise=0.0005)
    job.add(semconv.PROM_DISK_OPERATIONS, {**job.rank_labels(1), DEVICE: "nvme0n1",
            DISK_DIRECTION: "read"}, 400.0, 200.0, at=99, noise=2.0)  # fmt: skip
    report = job.report()
    assert report.first is not None and report.first.component == "node1/nvme0n1"
    assert not report.first.effect
    assert report.first.per_step_ratio == pytest.approx(1.0, abs=0.1)


def test_a_nic_that_trained_down_is_named_by_its_link_speed() -> None:
    """Issue 25: a real NIC that renegotiated from 25 to 1 Gbit/s shows in its link speed (the
    counterpart of the emulated fabric's shaped qdisc rate); with the job's transfers slower,
    it is the first change."""
    job = Job(seed=17)
    job.healthy(step_at=106)
    for rank in range(4):
        job.add(semconv.PROM_NETWORK_SPEED, {**job.rank_labels(rank), IFACE: "eth0"},
                25e9 / 8, 1e9 / 8 if rank == 1 else None, at=100)  # fmt: skip
    job.transfers_rise(at=102)
    report = job.report()
    assert report.first is not None
    assert (report.first.kind, report.first.component, report.first.signal) == (
        semconv.COMPONENT_NIC,
        "node1/eth0",
        semconv.METRIC_NETWORK_SPEED,
    )
    assert report.first.ratio == pytest.approx(1 / 25)


def test_no_regression_means_no_changes() -> None:
    job = Job(seed=5)
    job.healthy(step_at=None)
    job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node3"}, 0.0, 40.0, at=100)
    report = job.report()
    assert report.regression is None
    assert report.changes == ()
    assert "no step-time regression" in report.summary()
    assert report.to_json()["regression"] is None


def test_changes_that_ended_or_started_too_early_are_not_suspects() -> None:
    job = Job(length=600, seed=6)
    job.healthy(step_at=500)
    # A burst on node2's disk that was over before the regression.
    stored = job.source._series[semconv.PROM_DISK_OPERATION_TIME]
    for index, series in enumerate(stored):
        if series.labels[HOST] == "node2":
            values = [0.9 if 300 <= t - T0 < 320 else v for t, v in
                      zip(series.times, series.values, strict=True)]  # fmt: skip
            stored[index] = type(series)(series.labels, series.times, values)
    # Node0's drops started 400 s before the regression: past the 300 s lookback.
    job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node0"}, 0.0, 5.0, at=100)
    report = job.report()
    assert [c.kind for c in report.changes] == [semconv.COMPONENT_STEP]


def test_a_change_as_the_job_starts_is_its_start_not_a_cause() -> None:
    """Node0's queue starts dropping 8 s into the job (traffic beginning) and stays so; the
    loader slows 60 s in, with the step time. Within ``startup_s`` (10 s) of the job's first
    step-time sample the drops are the job starting; with no start-up allowance they would
    have been named first."""
    job = Job(length=120, seed=7)
    job.healthy(step_at=60)
    job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node0"}, 0.0, 5.0, at=8)
    job.replace(semconv.PROM_DATALOADER_WAIT, {HOST: "node1"}, 0.01, 0.5, at=60, noise=0.0005)
    kinds = [c.kind for c in job.report().changes]
    assert kinds[0] == semconv.COMPONENT_DATALOADER, kinds
    assert semconv.COMPONENT_NIC not in kinds, kinds
    no_allowance = first_change(
        job.source, JOB_ID, T0, T0 + job.length - 1, Settings(startup_s=0.0)
    )
    # Without the allowance the drops are a change, though off the job's path (no
    # collective waited): listed apart.
    assert [c.kind for c in no_allowance.also_changed] == [semconv.COMPONENT_NIC]


# --------------------------------------------------------------------------------- compare


def test_compare_sorts_by_relative_change() -> None:
    job = Job(seed=7)
    job.healthy(step_at=100, step_after=0.75)
    job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node3"}, 0.0, 40.0, at=100)
    job.replace(semconv.PROM_COLLECTIVE_TRANSFER, {PG: "dp"}, 0.01, 0.03, at=100, noise=0.0002)
    result = compare(job.source, JOB_ID, TimeRange(T0 + 10, T0 + 90), TimeRange(T0 + 110, T0 + 190))
    rows = result.rows
    assert (rows[0].component, rows[0].signal) == ("node3/eth0", "training.qdisc.drops{tbf}")
    assert rows[0].change == ZERO_BASELINE_RATIO
    assert (rows[1].component, rows[1].kind) == ("dp", semconv.COMPONENT_COLLECTIVE)
    assert rows[1].change == pytest.approx(2.0, rel=0.05)
    step = {row.statistic: row for row in rows if row.kind == semconv.COMPONENT_STEP}
    assert step["mean"].change == pytest.approx(0.5, rel=0.05)
    assert step["p50"].before == pytest.approx(0.5, rel=0.05)
    changes = [abs(row.change) for row in rows]
    assert changes == sorted(changes, reverse=True)
    table = result.table()
    assert table.splitlines()[1].startswith("node3/eth0") and "from zero" in table
    assert json.loads(json.dumps(result.to_json()))["rows"][0]["component"] == "node3/eth0"


# ---------------------------------------------------------------------- queries and parsing


def test_promql_of_each_form() -> None:
    assert promql(Query("m", Form.GAUGE), "j", 4) == 'm{training_job_id="j"}'
    assert (
        promql(Query("m_total", Form.RATE), "j", 4) == 'rate(m_total{training_job_id="j"}[4000ms])'
    )
    assert promql(Query("h", Form.MEAN, labels=((RANK, "1"),)), 'a"b', 2) == (
        'rate(h_sum{training_job_id="a\\"b", training_rank="1"}[2000ms]) / '
        'rate(h_count{training_job_id="a\\"b", training_rank="1"}[2000ms])'
    )
    assert promql(Query("w", Form.RATIO, "f"), "j", 4) == (
        'rate(w{training_job_id="j"}[4000ms]) / rate(f{training_job_id="j"}[4000ms])'
    )


def test_time_parsing() -> None:
    now = 1_000_000.0
    assert command.parse_time("now", now) == now
    assert command.parse_time("-30m", now) == now - 1800
    assert command.parse_time("-1h30m", now) == now - 5400
    assert command.parse_time("1700000000.5", now) == 1700000000.5
    assert command.parse_time("2023-11-14T22:13:20Z", now) == 1700000000.0
    assert command.parse_time("2023-11-14T23:13:20+01:00", now) == 1700000000.0
    assert command.parse_range("-10m..-5m", now) == (now - 600, now - 300)
    for bad in ("yesterday", "2023-11-14T22:13:20", "-10x"):
        with pytest.raises(ValueError):
            command.parse_time(bad, now)
    with pytest.raises(ValueError):
        command.parse_range("-10m", now)
    assert command.parse_duration("90") == 90 and command.parse_duration("1m30s") == 90
    with pytest.raises(ValueError):
        command.parse_duration("0s")


def _cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skewtrace.cli", "timeline", *argv],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def test_cli_with_prometheus_down_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for argv in (
        ("first-change", "--prometheus", url, "--job", "x"),
        ("compare", "--prometheus", url, "--job", "x", "--before", "-20m..-10m",
         "--after", "-10m..now", "--json"),
    ):  # fmt: skip
        done = _cli(*argv)
        assert done.returncode == 1, done
        assert url in done.stderr and "not reachable" in done.stderr
        assert "Traceback" not in done.stderr and done.stdout == ""


def test_cli_bad_range_is_a_usage_error() -> None:
    done = _cli("compare", "--prometheus", "http://127.0.0.1:1", "--job", "x",
                "--before", "yesterday", "--after", "-10m..now")  # fmt: skip
    assert done.returncode == 2
    assert "--before" in done.stderr and "Traceback" not in done.stderr


class _Answer(http.server.BaseHTTPRequestHandler):
    status = 500
    body = b"<html>proxy error</html>"

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def answering_server() -> Iterator[Callable[[int, bytes], str]]:
    servers: list[http.server.HTTPServer] = []

    def serve(status: int, body: bytes) -> str:
        handler = type("Handler", (_Answer,), {"status": status, "body": body})
        server = http.server.HTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def test_prometheus_errors_name_the_url_and_the_message(
    answering_server: Callable[[int, bytes], str],
) -> None:
    url = answering_server(500, b"<html>proxy error</html>")
    with pytest.raises(PrometheusError, match="HTTP 500") as caught:
        PrometheusSource(url, step_s=1).series(STEP_TIME, "x", T0, T0 + 60)
    assert caught.value.url == url and caught.value.kind == "http"
    error = b'{"status":"error","errorType":"bad_data","error":"parse error at char 3"}'
    url = answering_server(400, error)
    with pytest.raises(PrometheusError, match="bad_data: parse error at char 3"):
        PrometheusSource(url, step_s=1).series(STEP_TIME, "x", T0, T0 + 60)


# ---------------------------------------------------------------------------------- watch

RECORDED_EVENTS: dict[str, list[tuple[str, int, dict[str, Any]]]] = {}


class _EventRecordingTraceService(otlp_sink._TraceService):
    """otlp_sink's trace service, also keeping each span's events (it keeps none)."""

    def Export(self, request: Any, context: Any) -> Any:
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    RECORDED_EVENTS[span.span_id.hex()] = [
                        (e.name, e.time_unix_nano, otlp_sink.attributes(e.attributes))
                        for e in span.events
                    ]
        return super().Export(request, context)


@pytest.fixture
def sink(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpSink]:
    RECORDED_EVENTS.clear()
    monkeypatch.setattr(otlp_sink, "_TraceService", _EventRecordingTraceService)
    with OtlpSink() as running:
        yield running


def test_watch_publishes_the_gauge_and_one_span_per_regression(sink: OtlpSink) -> None:
    from skewtrace.timeline.service import timeline_tracer_provider

    job = Job(seed=8)
    job.healthy(step_at=108)
    job.replace(semconv.PROM_QDISC_DROPS, {HOST: "node3"}, 0.0, 40.0, at=100)
    job.replace(semconv.PROM_COLLECTIVE_TRANSFER, {PG: "dp"}, 0.01, 0.034, at=102, noise=0.0002)
    provider = timeline_tracer_provider(sink.endpoint)
    watcher = Watcher(
        job.source,
        WatchConfig(JOB_ID, since_s=199, interval_s=1),
        tracer_provider=provider,
        clock=lambda: T0 + 199,
    )
    port = free_port()
    server, _ = start_http_server(port, "127.0.0.1", registry=watcher.registry)
    try:
        report = watcher.run_once()
        assert report is not None and report.regression is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
        watcher.run_once()  # the same regression again: no second span
        provider.force_flush()
    finally:
        server.shutdown()
        provider.shutdown()

    samples = [
        sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == semconv.PROM_FIRST_CHANGE
    ]
    by_order = {sample.labels["training_change_order"]: sample for sample in samples}
    assert sorted(by_order) == ["0", "1", "2"], text
    assert by_order["0"].labels == {
        "training_job_id": JOB_ID,
        "training_component_kind": semconv.COMPONENT_NIC,
        "training_component": "node3/eth0",
        "training_signal": "training.qdisc.drops{tbf}",
        "training_change_order": "0",
        "training_change_effect": "false",
    }
    assert by_order["0"].value == T0 + 100
    assert by_order["1"].labels["training_component"] == "dp"
    assert by_order["2"].labels["training_component_kind"] == semconv.COMPONENT_STEP
    assert by_order["2"].value == T0 + 108

    spans = sink.wait_for_spans(lambda s: len(s) >= 1, timeout=10)
    time.sleep(0.5)
    spans = [s for s in sink.spans() if s.name == semconv.SPAN_FIRST_CHANGE]
    assert len(spans) == 1, spans
    span = spans[0]
    step = report.regression.step
    assert step == 216
    assert span.trace_id == f"{_ids.step_trace_id(JOB_ID, step):032x}"
    assert span.parent_span_id == f"{_ids.step_root_span_id(JOB_ID, step):016x}"
    assert span.resource[semconv.SERVICE_NAME] == SERVICE_NAME
    assert span.attributes[semconv.JOB_ID] == JOB_ID
    assert span.attributes[semconv.COMPONENT] == "node3/eth0"
    assert span.attributes[semconv.COMPONENT_KIND] == semconv.COMPONENT_NIC
    assert span.attributes[semconv.CHANGE_ONSET] == T0 + 100
    assert span.attributes[semconv.STEP] == step
    events = RECORDED_EVENTS[span.span_id]
    assert [name for name, _, _ in events] == [semconv.EVENT_CHANGE] * 3
    assert [attrs[semconv.CHANGE_ORDER] for _, _, attrs in events] == [0, 1, 2]
    assert [attrs[semconv.COMPONENT] for _, _, attrs in events] == ["node3/eth0", "dp", JOB_ID]
    assert [attrs[semconv.CHANGE_EFFECT] for _, _, attrs in events] == [False] * 3
    assert events[1][1] == int((T0 + 102) * 1e9)


def test_watch_survives_prometheus_down_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    source = PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    watcher = Watcher(source, WatchConfig("x", interval_s=0.01))
    with caplog.at_level(logging.WARNING, logger="skewtrace.timeline"):
        assert watcher.run_once() is None
        assert watcher.run_once() is None
        stopper = threading.Timer(0.2, watcher.stop)
        stopper.start()
        watcher.run()  # returns when stopped, whatever each run met
    messages = [r.getMessage() for r in caplog.records if r.name == "skewtrace.timeline"]
    assert len(messages) == 1, messages
    assert "unreachable" in messages[0] and source.url in messages[0]


@pytest.mark.slow
def test_watch_cli_serves_metrics_and_outlives_prometheus_down() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "skewtrace.cli", "timeline", "watch", "--prometheus", dead,
         "--job", "x", "--interval", "0.3", "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "watch never served /metrics"
                time.sleep(0.2)
        time.sleep(1.5)  # several intervals with Prometheus down
        assert process.poll() is None, process.communicate()
        process.terminate()
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    warnings = [line for line in stderr.splitlines() if "not reachable" in line]
    assert len(warnings) == 1, stderr
    assert dead in warnings[0]


# ------------------------------------------------------------------ with a real Prometheus

SCRAPE_S = 1.0
# node3's qdisc starts dropping: past the start-up allowance (first_change's startup_s, 10 s
# from the first step-time sample, which Prometheus takes a few seconds after the exporter
# starts; at 14 s a late first scrape put the fault inside it and its onset was found late).
FAULT_AT_S = 20.0
TRANSFER_AT_S = FAULT_AT_S + 3  # then the collective transfer slows
STEP_AT_S = FAULT_AT_S + 6  # then the steps
RUN_S = STEP_AT_S + 12


class Exporter:
    """The series the Collector would export, from this process, changed as the test says."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        rank_labels = [JOB, RANK, HOST, SWITCH]
        self.step = Histogram(
            semconv.PROM_STEP_DURATION, "step", rank_labels, registry=self.registry,
            buckets=(0.05, 0.1, 0.2, 0.4, 1.0),
        )  # fmt: skip
        self.transfer = Histogram(
            semconv.PROM_COLLECTIVE_TRANSFER, "transfer", [JOB, PG, OP], registry=self.registry
        )
        # prometheus_client adds _total to a counter's name.
        self.drops = Counter(
            semconv.PROM_QDISC_DROPS.removesuffix("_total"), "drops",
            [*rank_labels, IFACE, QDISC_KIND], registry=self.registry,
        )  # fmt: skip
        self.gpu = Gauge(
            semconv.PROM_GPU_UTILIZATION, "gpu", [*rank_labels, GPU_UUID], registry=self.registry
        )

    def labels(self, rank: int) -> dict[str, str]:
        host = f"node{rank}"
        return {JOB: JOB_ID, RANK: str(rank), HOST: host, SWITCH: NODES[host]}

    def tick(self, elapsed_s: float, tick_s: float) -> None:
        step_s = 0.2 if elapsed_s >= STEP_AT_S else 0.1
        for rank in range(4):
            labels = self.labels(rank)
            self.step.labels(**labels).observe(step_s)
            self.gpu.labels(**labels, **{GPU_UUID: f"GPU-{rank}"}).set(0.9)
            drops = self.drops.labels(**labels, **{IFACE: "eth0", QDISC_KIND: "tbf"})
            if rank == 3 and elapsed_s >= FAULT_AT_S:
                drops.inc(5)
            else:
                drops.inc(0)
        transfer = 0.03 if elapsed_s >= TRANSFER_AT_S else 0.01
        self.transfer.labels(**{JOB: JOB_ID, PG: "dp", OP: "all_reduce"}).observe(transfer)


@pytest.mark.slow
@pytest.mark.prometheus
def test_first_change_and_compare_against_a_real_prometheus(
    tmp_path: Path, prometheus_binary: str
) -> None:
    binary = prometheus_binary
    exporter = Exporter()
    exporter_port = free_port()
    server, _ = start_http_server(exporter_port, "127.0.0.1", registry=exporter.registry)
    prometheus = PrometheusServer(
        binary, free_port(), {"skewtrace": [f"127.0.0.1:{exporter_port}"]}, tmp_path / "prom",
        scrape_interval_s=SCRAPE_S,
    )  # fmt: skip
    try:
        with prometheus:
            started = time.time()
            tick_s = 0.1
            while (elapsed := time.time() - started) < RUN_S:
                exporter.tick(elapsed, tick_s)
                time.sleep(tick_s)
            time.sleep(2 * SCRAPE_S)
            done = _cli("first-change", "--prometheus", prometheus.url, "--job", JOB_ID,
                        "--since", f"{int(RUN_S + 10)}s", "--json")  # fmt: skip
            assert done.returncode == 0, done.stderr
            report = json.loads(done.stdout)
            text = _cli("first-change", "--prometheus", prometheus.url, "--job", JOB_ID,
                        "--since", f"{int(RUN_S + 10)}s")  # fmt: skip
            before = f"{started + 5:.0f}..{started + FAULT_AT_S - 1:.0f}"
            after = f"{started + STEP_AT_S + 5:.0f}..{started + RUN_S:.0f}"
            compared = _cli("compare", "--prometheus", prometheus.url, "--job", JOB_ID,
                            "--before", before, "--after", after, "--json")  # fmt: skip
            table = _cli("compare", "--prometheus", prometheus.url, "--job", JOB_ID,
                         "--before", before, "--after", after)  # fmt: skip
    finally:
        server.shutdown()
    print(json.dumps(report, indent=1))
    changes = report["changes"]
    assert [(c["kind"], c["component"]) for c in changes] == [
        (semconv.COMPONENT_NIC, "node3/eth0"),
        (semconv.COMPONENT_COLLECTIVE, "dp"),
        (semconv.COMPONENT_STEP, JOB_ID),
    ], report
    onsets = [c["onset"] - started for c in changes]
    # Each onset within a couple of scrapes after its cause (scrape phase, rate window).
    for onset, truth in zip(onsets, (FAULT_AT_S, TRANSFER_AT_S, STEP_AT_S), strict=True):
        assert truth - SCRAPE_S <= onset <= truth + 3 * SCRAPE_S, (onsets, report)
    assert report["regression"]["ratio"] == pytest.approx(2.0, rel=0.15)
    assert report["regression"]["step"] is not None
    assert text.returncode == 0 and text.stdout.startswith("node3/eth0 training.qdisc.drops{tbf}")

    assert compared.returncode == 0, compared.stderr
    rows = json.loads(compared.stdout)["rows"]
    assert (rows[0]["component"], rows[0]["signal"]) == ("node3/eth0", "training.qdisc.drops{tbf}")
    step_mean = next(r for r in rows if r["kind"] == "step" and r["statistic"] == "mean")
    assert step_mean["change"] == pytest.approx(1.0, rel=0.15)
    transfer = next(r for r in rows if r["component"] == "dp")
    assert transfer["change"] == pytest.approx(2.0, rel=0.15)
    assert table.returncode == 0 and "node3/eth0" in table.stdout.splitlines()[1]
