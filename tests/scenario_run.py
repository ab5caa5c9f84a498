"""Run scenario_gen scenarios through a real otelcol-skewtrace and read back its verdicts.

    with CollectorProcess(otelcol, [OTELCOL_YAML, FILE_EXPORT_YAML], tmp) as col:
        outcomes = run_scenarios(col, SCENARIOS.values())

Every scenario is a job of its own, sent concurrently (one thread each) at about
`steps_per_s` steps per second, as a real job's ranks would export them. The verdicts are
the collector's `train.step.summary` spans: per step, the flagged ranks with their cause
and the suspected parts of the fabric, after the collector's hysteresis.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

from collector_harness import CollectorProcess, iter_file_export
from scenario_gen import Scenario
from skewtrace.cluster.outcome import StepVerdict, verdicts_of

__all__ = ["Outcome", "StepVerdict", "read_verdicts", "run_scenarios", "send_scenario"]


@dataclass
class Outcome:
    scenario: Scenario
    steps: dict[int, StepVerdict]

    def last(self) -> StepVerdict:
        return self.steps[max(self.steps)]

    def first_flag_step(self) -> int | None:
        """First step at which the expected verdict (ranks, causes, suspects) holds."""
        exp = self.scenario.expected
        for s in sorted(self.steps):
            v = self.steps[s]
            if exp.allowed is not None:
                if v.flagged:
                    return s
                continue
            if (
                v.flagged == exp.flagged
                and exp.suspects <= v.suspects
                and (exp.flagged or exp.suspects)
            ):
                return s
        return None

    def clear_step(self) -> int | None:
        """First step at or after the faults' end from which nothing is flagged any more."""
        end = self.scenario.fault_end()
        if end is None:
            return None
        clear = None
        for s in sorted(self.steps):
            if s < end:
                continue
            v = self.steps[s]
            if v.flagged or v.suspects:
                clear = None
            elif clear is None:
                clear = s
        return clear


def send_scenario(endpoint: str, scenario: Scenario, steps_per_s: float) -> None:
    with grpc.insecure_channel(endpoint) as channel:
        stub = TraceServiceStub(channel)
        start = time.monotonic()
        for i, wave in enumerate(scenario.requests()):
            for request in wave:
                stub.Export(request, timeout=30)
            delay = start + (i + 1) / steps_per_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)


def read_verdicts(col: CollectorProcess) -> dict[str, dict[int, StepVerdict]]:
    """Per job, the collector's verdict after each analysed step (the package's reader)."""
    return verdicts_of(iter_file_export(col.file_export_path))


def run_scenarios(
    col: CollectorProcess,
    scenarios: Iterable[Scenario],
    *,
    steps_per_s: float = 10.0,
    timeout_s: float = 120.0,
) -> dict[str, Outcome]:
    scenarios = list(scenarios)
    threads = [
        threading.Thread(
            target=send_scenario, args=(col.otlp_grpc_endpoint, s, steps_per_s), daemon=True
        )
        for s in scenarios
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        verdicts = read_verdicts(col)
        missing = [s.name for s in scenarios if len(verdicts.get(s.job, {})) < s.steps]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if missing:
        raise AssertionError(
            f"no summaries for every step of {missing} after {timeout_s}s\n" + col.log_tail()
        )
    return {s.name: Outcome(s, verdicts[s.job]) for s in scenarios}
