"""The two-tier gateway with real processes: one tier-1 collector (collector-config/
gateway.yaml, loadbalancing exporter routing by trace ID) in front of two tier-2 collectors
(otelcol.yaml + file-export.yaml, each running barrierskew), fed by the synthetic job of
tools/loadgen in many small requests so that each step's spans arrive interleaved.

Because every span of a step shares the step's trace ID, each step, and so each collective,
must land whole on exactly one tier-2 instance and be joined complete there. With the
gateway-by-job.yaml overlay each job lands whole on one instance, and its straggler is
flagged after as few steps as by a single collector.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pytest

from collector_harness import (
    FILE_EXPORT_YAML,
    GATEWAY_BY_JOB_YAML,
    GATEWAY_YAML,
    OTELCOL_YAML,
    CollectorProcess,
    FileSpan,
    find_samples,
    gateway_tier2,
    loadgen_for_tests,
    parse_prometheus,
    run_loadgen_send,
    scrape,
)
from skewtrace import semconv
from skewtrace.report.collect import parse_summary
from span_replay import collector_constant, collector_default

pytestmark = [pytest.mark.collector, pytest.mark.slow]


@pytest.fixture(scope="module")
def loadgen() -> Path:
    return loadgen_for_tests()


def test_gateway_routes_each_step_to_one_tier2_instance(
    otelcol_path: Path,
    loadgen: Path,
    tmp_path: Path,
) -> None:
    ranks, steps, buckets, tp = 64, 16, 4, 8
    job = "gateway"
    tier2 = [
        CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], tmp_path, name=name)
        for name in ("tier2-a", "tier2-b")
    ]
    endpoints = ", ".join(c.otlp_grpc_endpoint for c in tier2)
    tier1 = CollectorProcess(
        otelcol_path,
        [GATEWAY_YAML],
        tmp_path,
        name="tier1",
        env={"SKEWTRACE_TIER2_ENDPOINTS": f"[{endpoints}]"},
    )
    with tier2[0], tier2[1], tier1:
        sent = run_loadgen_send(
            loadgen, tier1.otlp_grpc_endpoint,
            "-job", job, "-ranks", str(ranks), "-steps", str(steps),
            "-collectives", str(buckets), "-tp", str(tp), "-ranks-per-request", "4",
            "-straggler", "9:compute:30ms",
        )  # fmt: skip
        assert sent["failed_requests"] == 0

        # Every span the job sent, and each instance's summaries of the steps it analyzed.
        def written() -> tuple[dict[str, list[FileSpan]], dict[str, list[FileSpan]]]:
            spans, summaries = {}, {}
            for c in tier2:
                exported = c.exported_spans()
                spans[c.name] = [s for s in exported if s.name != semconv.SPAN_STEP_SUMMARY]
                summaries[c.name] = [s for s in exported if s.name == semconv.SPAN_STEP_SUMMARY]
            return spans, summaries

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            per_instance, summaries = written()
            received = sum(len(s) for s in per_instance.values())
            if received >= sent["spans"] and sum(len(s) for s in summaries.values()) >= steps:
                break
            time.sleep(0.5)
        assert received == sent["spans"], f"tier 2 wrote {received} of {sent['spans']} spans"
        assert sum(len(s) for s in summaries.values()) == steps

        # Each step (trace) lands on exactly one instance, and both instances get steps.
        traces_on: dict[str, set[str]] = defaultdict(set)
        for name, spans in per_instance.items():
            for span in spans:
                traces_on[span.trace_id].add(name)
        assert len(traces_on) == steps
        split = {t: names for t, names in traces_on.items() if len(names) != 1}
        assert not split, f"steps split across instances: {split}"
        assert {n for names in traces_on.values() for n in names} == {"tier2-a", "tier2-b"}

        # Each collective is joined complete on exactly one instance.
        collectives: dict[tuple, dict[str, list[FileSpan]]] = defaultdict(lambda: defaultdict(list))
        for name, spans in per_instance.items():
            for span in spans:
                if span.name.startswith("collective."):
                    key = (
                        span.attributes["training.collective.pg"],
                        span.attributes["training.collective.seq"],
                    )
                    collectives[key][name].append(span)
        assert len(collectives) == steps * (buckets + ranks // tp)
        for key, by_instance in collectives.items():
            assert len(by_instance) == 1, f"{key} seen on {sorted(by_instance)}"
            (members,) = by_instance.values()
            assert len(members) == members[0].attributes["training.collective.pg_size"], key
            assert len({s.resource["training.rank"] for s in members}) == len(members), key
            for span in members:
                assert "training.barrier.skew" in span.attributes, key
                assert "training.barrier.missing_ranks" not in span.attributes, key

        # Each step's summary is written where its step landed (it is in the step's trace),
        # and each instance, analyzing whole steps, finds the same root cause.
        for name, mine in summaries.items():
            assert {s.trace_id for s in mine} <= {
                t for t, names in traces_on.items() if names == {name}
            }, name
            roots = {
                (e["attributes"][semconv.RANK], e["attributes"][semconv.STRAGGLER_CAUSE])
                for s in mine
                for e in s.events
                if e["name"] == semconv.EVENT_ROOT_CAUSE
            }
            assert roots == {(9, "compute")}, (name, roots)
            # Without gateway-tier2.yaml flags are each instance's own, over the steps it saw:
            # past the job's warm-up steps, flag_k of them are needed. How the
            # trace-ID ring splits the 16 steps depends on the tier-2 ports; an instance with
            # fewer cannot flag yet, and must not flag anyone else. (With the overlay, one
            # instance decides the job's flags: the next test.)
            last = max(mine, key=lambda s: s.attributes[semconv.STEP])
            flagged = {
                (e["attributes"][semconv.RANK], e["attributes"][semconv.STRAGGLER_CAUSE])
                for e in last.events
                if e["name"] == semconv.EVENT_STRAGGLER
            }
            if len(mine) >= collector_constant("warmupSteps") + collector_default("FlagK"):
                assert flagged == {(9, "compute")}, (name, len(mine), flagged)
            else:
                assert flagged <= {(9, "compute")}, (name, len(mine), flagged)


def test_gateway_by_job_keeps_each_job_on_one_instance_and_flags_it_early(
    otelcol_path: Path,
    loadgen: Path,
    tmp_path: Path,
) -> None:
    """Two jobs of 6 steps each, their stragglers slow from step 0: routed by job, each job's
    spans are all on one tier-2 instance, whose last summary of the job flags the straggler
    (flag_k is 4: routed by step, each of two instances would see about 3 of the 6 steps)."""
    ranks, steps = 32, 6
    tier2 = [
        CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], tmp_path, name=name)
        for name in ("tier2-a", "tier2-b")
    ]
    endpoints = ", ".join(c.otlp_grpc_endpoint for c in tier2)
    tier1 = CollectorProcess(
        otelcol_path,
        [GATEWAY_YAML, GATEWAY_BY_JOB_YAML],
        tmp_path,
        name="tier1",
        env={"SKEWTRACE_TIER2_ENDPOINTS": f"[{endpoints}]"},
    )
    jobs = {"by-job-a": 5, "by-job-b": 20}
    with tier2[0], tier2[1], tier1:
        total = 0
        for job, straggler in jobs.items():
            sent = run_loadgen_send(
                loadgen, tier1.otlp_grpc_endpoint,
                "-job", job, "-ranks", str(ranks), "-steps", str(steps), "-collectives", "4",
                "-ranks-per-request", "4", "-straggler", f"{straggler}:compute:30ms",
            )  # fmt: skip
            assert sent["failed_requests"] == 0
            total += sent["spans"]

        def exported() -> dict[str, list[FileSpan]]:
            return {c.name: c.exported_spans() for c in tier2}

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            spans = exported()
            summaries = [
                s for ss in spans.values() for s in ss if s.name == semconv.SPAN_STEP_SUMMARY
            ]
            received = sum(len(ss) for ss in spans.values()) - len(summaries)
            if received >= total and len(summaries) >= steps * len(jobs):
                break
            time.sleep(0.5)
        assert received == total, f"tier 2 wrote {received} of {total} spans"

    for job, straggler in jobs.items():
        on = {
            name
            for name, ss in spans.items()
            for s in ss
            if s.resource.get(semconv.JOB_ID) == job or s.attributes.get(semconv.JOB_ID) == job
        }
        assert len(on) == 1, f"{job} spread over {sorted(on)}"
        (name,) = on
        mine = [
            s
            for s in spans[name]
            if s.name == semconv.SPAN_STEP_SUMMARY
            and (s.resource.get(semconv.JOB_ID) == job or s.attributes.get(semconv.JOB_ID) == job)
        ]
        assert sorted(s.attributes[semconv.STEP] for s in mine) == list(range(steps)), job
        last = max(mine, key=lambda s: s.attributes[semconv.STEP])
        flagged = {
            (e["attributes"][semconv.RANK], e["attributes"][semconv.STRAGGLER_CAUSE])
            for e in last.events
            if e["name"] == semconv.EVENT_STRAGGLER
        }
        assert flagged == {(straggler, "compute")}, (job, flagged)


def _summaries(spans: list[FileSpan], job: str) -> list[FileSpan]:
    return [
        s
        for s in spans
        if s.name == semconv.SPAN_STEP_SUMMARY and s.resource.get(semconv.JOB_ID) == job
    ]


def _flags(span: FileSpan) -> set[tuple[int, str]]:
    summary = parse_summary(span)
    assert summary is not None, span
    return {(f.rank, f.cause) for f in summary.flags}


def _wait_for_summaries(
    instances: list[CollectorProcess], job: str, steps: int
) -> dict[str, list[FileSpan]]:
    deadline = time.monotonic() + 90
    while True:
        found = {c.name: _summaries(c.exported_spans(), job) for c in instances}
        if sum(len(s) for s in found.values()) >= steps or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_gateway_decides_each_jobs_flags_as_one_instance_does(
    otelcol_path: Path,
    loadgen: Path,
    tmp_path: Path,
) -> None:
    """Issue 21, item 6: behind the gateway with gateway-tier2.yaml, each step is analyzed
    where it was joined, and one tier-2 instance decides the job's flags from every
    instance's step summaries. The same job sent to one instance and through the gateway gives
    the same flagged rank, from the same step, and one flag gauge on one /metrics page.
    (Routed by step without the overlay, neither instance had the steps to flag it.)"""
    job, ranks, steps, onset = "verdicts", 64, 16, 4
    args = [
        "-job", job, "-ranks", str(ranks), "-steps", str(steps), "-collectives", "4",
        "-tp", "8", "-ranks-per-request", "4",
        "-straggler", "9:compute:30ms", "-straggler-from", str(onset),
    ]  # fmt: skip

    single = CollectorProcess(
        otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], tmp_path / "single", name="single"
    )
    with single:
        assert run_loadgen_send(loadgen, single.otlp_grpc_endpoint, *args)["failed_requests"] == 0
        alone = _wait_for_summaries([single], job, steps)["single"]
    assert len(alone) == steps

    tier2 = gateway_tier2(
        otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], tmp_path / "gw", ["tier2-a", "tier2-b"]
    )
    endpoints = ", ".join(c.otlp_grpc_endpoint for c in tier2)
    tier1 = CollectorProcess(
        otelcol_path,
        [GATEWAY_YAML],
        tmp_path / "gw",
        name="tier1",
        env={"SKEWTRACE_TIER2_ENDPOINTS": f"[{endpoints}]"},
    )
    with tier2[0], tier2[1], tier1:
        assert run_loadgen_send(loadgen, tier1.otlp_grpc_endpoint, *args)["failed_requests"] == 0
        found = _wait_for_summaries(tier2, job, steps)
        # The job's /metrics: its flag gauge on the deciding instance only. The gauge is
        # emitted at the connector's next flush (1 s).
        time.sleep(2)
        pages = {c.name: parse_prometheus(scrape(c.prometheus_url)) for c in tier2}
        # Each step was joined and analyzed on one instance; both instances had steps.
        steps_on = {
            c.name: {
                s.attributes[semconv.STEP]
                for s in c.exported_spans()
                if s.name == semconv.SPAN_STEP and s.resource.get(semconv.JOB_ID) == job
            }
            for c in tier2
        }
    assert all(steps_on.values()), f"a tier-2 instance joined no step: {steps_on}"
    assert not (steps_on["tier2-a"] & steps_on["tier2-b"]), steps_on

    # Every step's summary exactly once, decided, on the one instance that decides the job.
    deciders = [name for name, mine in found.items() if mine]
    assert len(deciders) == 1, {name: len(mine) for name, mine in found.items()}
    decided = found[deciders[0]]
    assert sorted(s.attributes[semconv.STEP] for s in decided) == list(range(steps))
    assert not any(s.attributes.get(semconv.VERDICT_DEFERRED) for s in decided)

    def by_step(summaries: list[FileSpan]) -> dict[int, set[tuple[int, str]]]:
        return {s.attributes[semconv.STEP]: _flags(s) for s in summaries}

    one, gateway = by_step(alone), by_step(decided)
    first_one = min(step for step, f in one.items() if f)
    first_gateway = min(step for step, f in gateway.items() if f)
    assert one[steps - 1] == {(9, "compute")}, one
    assert gateway[steps - 1] == one[steps - 1], (gateway, one)
    assert first_gateway == first_one, (
        f"flagged from step {first_gateway} behind the gateway, {first_one} alone"
    )
    assert all(f <= {(9, "compute")} for f in gateway.values()), gateway

    flag_gauges = {
        name: [
            s
            for s in find_samples(page, semconv.PROM_STRAGGLER, training_job_id=job)
            if s.value >= 1
        ]
        for name, page in pages.items()
    }
    assert [len(flag_gauges[name]) for name in sorted(pages)] == [
        1 if name == deciders[0] else 0 for name in sorted(pages)
    ], flag_gauges
    (gauge,) = flag_gauges[deciders[0]]
    assert gauge.labels[semconv.RANK.replace(".", "_")] == "9"
