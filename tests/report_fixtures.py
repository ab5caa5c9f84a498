"""Synthetic file-exporter output (OTLP/JSON lines) for the report's unit tests.

A small job model with true times: each rank fetches, runs forward and backward, then the
step's collectives (a collective ends at its last member's arrival plus a transfer), then its
optimizer. Spans are stamped with each host's clock (true time + the host's offset) and the
collectives carry the annotations the barrierskew processor writes, computed the same way
(skew, lateness, wait, transfer from durations; clock offset from end times). One
``train.step.summary`` per step names the straggler once it is flagged.
"""

from __future__ import annotations

import functools
import json
import statistics
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skewtrace import semconv

MS = 1e-3
T0 = 1_700_000_000.0


def _value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": str(v)}


def _attrs(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in d.items()]


def span_json(
    name: str, start_s: float, end_s: float, attrs: dict[str, Any], *, trace_id: str, events=()
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": "00000000000000aa",
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(round(start_s * 1e9)),
        "endTimeUnixNano": str(round(end_s * 1e9)),
        "attributes": _attrs(attrs),
    }
    if events:
        out["events"] = [
            {"timeUnixNano": "0", "name": n, "attributes": _attrs(a)} for n, a in events
        ]
    return out


def line(resource: dict[str, Any], spans: list[dict[str, Any]]) -> str:
    return json.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {"attributes": _attrs(resource)},
                    "scopeSpans": [{"scope": {"name": "skewtrace"}, "spans": spans}],
                }
            ]
        },
        separators=(",", ":"),
    )


@dataclass
class SyntheticJob:
    job: str = "synthetic"
    hosts: Sequence[str] = ("h0", "h0", "h1", "h1")  # host of each rank
    switches: dict[str, str] = field(default_factory=lambda: {"h0": "s0", "h1": "s1"})
    clock: dict[str, float] = field(default_factory=lambda: {"h0": 1.5, "h1": -0.7})
    # (pg, members, transfer_s) in step order
    groups: Sequence[tuple[str, tuple[int, ...], float]] = (
        ("pair0", (0, 2), 2 * MS),
        ("pair1", (1, 3), 2 * MS),
        ("default", (0, 1, 2, 3), 4 * MS),
    )
    steps: int = 6
    straggler: int = 2
    straggler_extra_s: float = 20 * MS
    onset: int = 2
    flag_after: int = 3
    slow_step: int | None = 4  # a step made longer for everyone
    forward_s: float = 10 * MS
    extra_per_step: dict[int, float] = field(default_factory=dict)
    # true times of the spans: (rank, step, name) -> (start, end)
    truth: dict[tuple[int, int, str], tuple[float, float]] = field(default_factory=dict)

    @property
    def ranks(self) -> int:
        return len(self.hosts)

    def trace_id(self, step: int) -> str:
        return f"{zlib.crc32(self.job.encode()):016x}{step:016x}"

    def resource(self, r: int) -> dict[str, Any]:
        host = self.hosts[r]
        return {
            semconv.SERVICE_NAME: semconv.DEFAULT_SERVICE_NAME,
            semconv.JOB_ID: self.job,
            semconv.RANK: r,
            semconv.HOST_NAME: host,
            semconv.SWITCH: self.switches.get(host, semconv.UNKNOWN),
            semconv.NIC: "eth0",
        }

    def lines(self) -> Iterator[str]:
        free = [T0] * self.ranks
        seqs: dict[str, int] = {}
        for step in range(self.steps):
            tid = self.trace_id(step)
            spans: dict[int, list[dict[str, Any]]] = {r: [] for r in range(self.ranks)}
            step_start = list(free)

            emit = functools.partial(self._emit, spans, step, tid)

            for r in range(self.ranks):
                extra = self.extra_per_step.get(step, 0.0)
                if r == self.straggler and step >= self.onset:
                    extra += self.straggler_extra_s
                if step == self.slow_step:
                    extra += 30 * MS
                t0 = free[r]
                emit(r, semconv.SPAN_DATALOADER_FETCH, t0, t0 + 1 * MS, {})
                emit(r, semconv.SPAN_FORWARD, t0 + 1 * MS, t0 + 1 * MS + self.forward_s + extra, {})
                b0 = t0 + 1 * MS + self.forward_s + extra
                emit(r, semconv.SPAN_BACKWARD, b0, b0 + 20 * MS, {})
                free[r] = b0 + 20 * MS
            for pg, members, transfer in self.groups:
                arrive = {m: free[m] for m in members}
                end = max(arrive.values()) + transfer
                durs = {m: end - arrive[m] for m in members}
                ends = sorted(end + self.clock[self.hosts[m]] for m in members)
                median_end = statistics.median(ends)
                seq = seqs.get(pg, 0)
                seqs[pg] = seq + 1
                for m in members:
                    attrs = {
                        semconv.COLLECTIVE_OP: semconv.OP_ALL_REDUCE,
                        semconv.COLLECTIVE_PG: pg,
                        semconv.COLLECTIVE_PG_SIZE: len(members),
                        semconv.COLLECTIVE_SEQ: seq,
                        semconv.BARRIER_SKEW: max(durs.values()) - min(durs.values()),
                        semconv.BARRIER_LATENESS: max(durs.values()) - durs[m],
                        semconv.BARRIER_WAIT: durs[m] - min(durs.values()),
                        semconv.BARRIER_TRANSFER: min(durs.values()),
                        semconv.CLOCK_OFFSET: end + self.clock[self.hosts[m]] - median_end,
                    }
                    emit(m, f"collective.{semconv.OP_ALL_REDUCE}", arrive[m], end, attrs)
                    free[m] = end
            for r in range(self.ranks):
                emit(r, semconv.SPAN_OPTIMIZER_STEP, free[r], free[r] + 3 * MS, {})
                emit(r, semconv.SPAN_STEP, step_start[r], free[r] + 3 * MS, {})
                free[r] += 3 * MS
            for r in range(self.ranks):
                yield line(self.resource(r), spans[r])
            yield self.summary_line(step, max(free) - max(step_start))

    def _emit(
        self,
        spans: dict[int, list[dict[str, Any]]],
        step: int,
        tid: str,
        r: int,
        name: str,
        t0: float,
        t1: float,
        attrs: dict[str, Any],
    ) -> None:
        """One span of rank r, stamped with its host's clock; its true times kept."""
        off = self.clock[self.hosts[r]]
        pg = attrs.get(semconv.COLLECTIVE_PG)
        self.truth[(r, step, f"{name}:{pg}" if pg else name)] = (t0, t1)
        spans[r].append(
            span_json(name, t0 + off, t1 + off, {semconv.STEP: step, **attrs}, trace_id=tid)
        )

    def summary_line(self, step: int, duration_s: float) -> str:
        events = []
        straggling = step >= self.onset and self.straggler_extra_s > 0
        flagged = straggling and step >= self.onset + self.flag_after - 1
        info = self.resource(self.straggler)
        topo = {k: info[k] for k in (semconv.RANK, semconv.HOST_NAME, semconv.SWITCH, semconv.NIC)}
        if straggling:
            events.append(
                (
                    semconv.EVENT_ROOT_CAUSE,
                    {
                        **topo,
                        semconv.STRAGGLER_CAUSE: semconv.CAUSE_COMPUTE,
                        semconv.RANK_COST: self.straggler_extra_s,
                    },
                )
            )
        if flagged:
            events.append(
                (
                    semconv.EVENT_STRAGGLER,
                    {
                        **topo,
                        semconv.STRAGGLER_CAUSE: semconv.CAUSE_COMPUTE,
                        semconv.RANK_COST: self.straggler_extra_s,
                    },
                )
            )
        attrs = {
            semconv.STEP: step,
            semconv.STEP_DURATION: duration_s,
            semconv.STEP_WHATIF: duration_s - (self.straggler_extra_s if straggling else 0.0),
            semconv.JOB_SLOWDOWN: 1.2 if straggling else 1.0,
            semconv.STEP_RANKS: self.ranks,
        }
        span = span_json(
            semconv.SPAN_STEP_SUMMARY,
            T0,
            T0 + duration_s,
            attrs,
            trace_id=self.trace_id(step),
            events=events,
        )
        return line({semconv.SERVICE_NAME: "skewtrace-collector", semconv.JOB_ID: self.job}, [span])

    def write(self, path: Path, *, extra_lines: Sequence[str] = ()) -> Path:
        with open(path, "a") as f:
            for text in self.lines():
                f.write(text + "\n")
            for text in extra_lines:
                f.write(text + "\n")
        return path
