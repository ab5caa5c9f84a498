"""A generator of training-job scenarios for the diagnosis table test and docs/evaluation.md.

A scenario is a parallel layout (process groups over ranks on hosts behind leaf switches),
a set of faults, host clock offsets, and a batching of each rank's spans. A small
discrete-event model plays the job: each rank fetches, runs forward and backward, then its
collectives in the layout's order (a collective ends at its latest member's arrival plus a
transfer that slow links stretch; a send does not wait for its receiver; a DDP bucket is
launched during backward and queues behind the previous bucket of its group), then its
optimizer step. It emits exactly the spans and attributes the instrumentation emits, as
OTLP requests, each rank's spans in batches of a few steps, the batches of all ranks
interleaved and out of order.

The expected verdict of every fault is part of the scenario: the root-cause ranks with
their cause, and the suspected parts of the fabric.

    scenario = SCENARIOS["nic-3x-2d"]
    for step_requests in scenario.requests():   # a list of ExportTraceServiceRequest per wave
        ...
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from skewtrace import semconv
from skewtrace._ids import step_trace_id

MS = 1e-3


@dataclass(frozen=True)
class Rank:
    rank: int
    host: str
    switch: str
    nic: str = "eth0"


@dataclass(frozen=True)
class Group:
    """One process group's collective in the step order (p2p: members are [src, dst])."""

    pg: str
    members: tuple[int, ...]
    op: str = "all_reduce"
    nbytes: int = 1 << 20
    transfer_s: float = 2 * MS
    p2p: bool = False
    async_bucket: bool = False


@dataclass
class Layout:
    name: str
    ranks: list[Rank]
    # The step's collectives in order; each rank runs those it is a member of, in this order.
    sequence: list[Group]
    description: str = ""

    def hosts(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for r in self.ranks:
            out.setdefault(r.host, []).append(r.rank)
        return out


def leaf_spine(n: int, ranks_per_host: int, hosts_per_switch: int) -> list[Rank]:
    return [
        Rank(r, f"node{r // ranks_per_host}", f"leaf{r // ranks_per_host // hosts_per_switch}")
        for r in range(n)
    ]


def layout_2d(n: int = 16, per_switch: int = 4) -> Layout:
    """Tensor-parallel groups inside a leaf, data-parallel groups across leaves, the world."""
    ranks = leaf_spine(n, 2, per_switch // 2)
    switches = n // per_switch
    seq = [
        Group(f"tp{s}", tuple(range(s * per_switch, (s + 1) * per_switch)), transfer_s=2 * MS)
        for s in range(switches)
    ]
    seq += [
        Group(f"dp{p}", tuple(s * per_switch + p for s in range(switches)), transfer_s=4 * MS)
        for p in range(per_switch)
    ]
    seq.append(Group(semconv.DEFAULT_PG_NAME, tuple(range(n)), nbytes=4 << 20, transfer_s=6 * MS))
    return Layout("2d", ranks, seq, "16 ranks, 2 per host, 4 leaves: TP in a leaf, DP across")


def layout_hierarchical(n: int = 16, per_switch: int = 4) -> Layout:
    """Hierarchical all-reduce: reduce-scatter inside each leaf, all-reduce across leaves,
    all-gather inside each leaf (no world group)."""
    ranks = leaf_spine(n, 2, per_switch // 2)
    switches = n // per_switch
    intra = [tuple(range(s * per_switch, (s + 1) * per_switch)) for s in range(switches)]
    cross = [tuple(s * per_switch + p for s in range(switches)) for p in range(per_switch)]
    seq = [Group(f"leaf{s}", m, op="reduce_scatter") for s, m in enumerate(intra)]
    seq += [Group(f"spine{p}", m, transfer_s=4 * MS) for p, m in enumerate(cross)]
    seq += [Group(f"leaf{s}", m, op="all_gather") for s, m in enumerate(intra)]
    return Layout(
        "hier", ranks, seq, "16 ranks: reduce-scatter in leaf, all-reduce across, all-gather"
    )


def layout_pairs(n: int = 16, per_switch: int = 4) -> Layout:
    """Groups inside a leaf and over pairs of leaves, so the leaves' uplinks can be told
    apart (every pair of leaves is joined by some groups and not by others)."""
    ranks = leaf_spine(n, 2, per_switch // 2)
    switches = n // per_switch
    seq = [
        Group(f"tp{s}", tuple(range(s * per_switch, (s + 1) * per_switch))) for s in range(switches)
    ]
    for a, b in ((0, 1), (2, 3), (0, 2), (1, 3)):
        for p in range(per_switch):
            seq.append(
                Group(
                    f"pair{a}{b}-{p}", (a * per_switch + p, b * per_switch + p), transfer_s=3 * MS
                )
            )
    return Layout("pairs", ranks, seq, "16 ranks: groups in a leaf and over pairs of leaves")


def layout_3d(tp: int = 2, pp: int = 4, dp: int = 4) -> Layout:
    """3D parallel: TP inside a host, PP stages by send/recv, DP replicas across leaves.
    Rank = d * (pp * tp) + s * tp + t; a host holds one TP group; a leaf one replica."""
    n = tp * pp * dp
    ranks = [Rank(r, f"node{r // tp}", f"leaf{r // (tp * pp)}") for r in range(n)]

    def rank(d: int, s: int, t: int) -> int:
        return d * pp * tp + s * tp + t

    seq: list[Group] = []
    for s in range(pp):  # forward: TP all-reduce of each stage, then send to the next
        for d in range(dp):
            seq.append(Group(f"tp{d}.{s}", tuple(rank(d, s, t) for t in range(tp))))
        if s < pp - 1:
            for d in range(dp):
                for t in range(tp):
                    seq.append(
                        Group(
                            f"pp{d}.{t}",
                            (rank(d, s, t), rank(d, s + 1, t)),
                            op="send_recv",
                            transfer_s=1 * MS,
                            p2p=True,
                        )
                    )
    for s in range(pp):  # gradient all-reduce of each stage across replicas
        for t in range(tp):
            seq.append(
                Group(f"dp{s}.{t}", tuple(rank(d, s, t) for d in range(dp)), transfer_s=4 * MS)
            )
    return Layout("3d", ranks, seq, f"{n} ranks: TP {tp} in a host, PP {pp} by send/recv, DP {dp}")


def layout_ddp(n: int = 8, buckets: int = 4) -> Layout:
    """Plain DDP: the world group's gradient buckets, launched during backward (async)."""
    ranks = leaf_spine(n, 2, 2)
    seq = [
        Group(semconv.DEFAULT_PG_NAME, tuple(range(n)), transfer_s=3 * MS, async_bucket=True)
        for _ in range(buckets)
    ]
    return Layout("ddp", ranks, seq, f"{n} ranks, one group, {buckets} async DDP buckets")


LAYOUTS: dict[str, Callable[[], Layout]] = {
    "2d": layout_2d,
    "hier": layout_hierarchical,
    "pairs": layout_pairs,
    "3d": layout_3d,
    "ddp": layout_ddp,
}


@dataclass(frozen=True)
class Fault:
    """A fault from step `start` (inclusive) to `end` (exclusive; None: to the end).

    kind: compute | data | nic | uplink | jitter
    target: ranks (compute, data, jitter), host names (nic), switch names (uplink)
    amount: seconds added (compute, data; max for jitter), or a transfer factor (nic, uplink)
    """

    kind: str
    target: tuple[str | int, ...]
    amount: float
    start: int = 0
    end: int | None = None

    def active(self, step: int) -> bool:
        return step >= self.start and (self.end is None or step < self.end)


@dataclass
class Expected:
    """What skewtrace should conclude while the faults are active."""

    flagged: dict[int, str] = field(default_factory=dict)  # rank -> cause
    suspects: set[str] = field(default_factory=set)
    # flagged ranks outside this set are wrong (jitter: any of the jittery ranks may be)
    allowed: set[int] | None = None


@dataclass
class Scenario:
    name: str
    layout: Layout
    faults: list[Fault]
    steps: int = 40
    seed: int = 1
    max_clock_offset_s: float = 2.0
    jitter_s: float = 0.5 * MS
    # Heavy-tailed noise of a shared machine: with this probability per rank and step, one
    # phase is held up by up to spike_s (a descheduled process, a page fault storm).
    spike_p: float = 0.03
    spike_s: float = 15 * MS
    batch_steps: tuple[int, int] = (1, 3)
    expected: Expected = field(default_factory=Expected)
    job: str = ""
    forward_s: float = 20 * MS
    backward_s: float = 40 * MS
    fetch_s: float = 2 * MS
    optimizer_s: float = 5 * MS
    gap_s: float = 1 * MS

    def __post_init__(self) -> None:
        if not self.job:
            self.job = f"scn-{self.name}"

    # -- the fault window --------------------------------------------------------------------
    def onset(self) -> int | None:
        return min((f.start for f in self.faults), default=None)

    def fault_end(self) -> int | None:
        ends = [f.end for f in self.faults]
        return None if not ends or any(e is None for e in ends) else max(e for e in ends if e)

    # -- the model ---------------------------------------------------------------------------
    def _extra(self, kind: str, step: int, rank: int, rng: random.Random) -> float:
        total = 0.0
        for f in self.faults:
            if f.kind == kind and f.active(step) and rank in f.target:
                total += f.amount
            if kind == "compute" and f.kind == "jitter" and f.active(step) and rank in f.target:
                total += rng.random() * f.amount
        return total

    def _link_factor(self, step: int, members: tuple[int, ...]) -> float:
        factor = 1.0
        ranks = self.layout.ranks
        for f in self.faults:
            if not f.active(step):
                continue
            if f.kind == "nic" and any(ranks[m].host in f.target for m in members):
                factor = max(factor, f.amount)
            if f.kind == "uplink":
                switches = {ranks[m].switch for m in members}
                if len(switches) > 1 and switches & set(map(str, f.target)):
                    factor = max(factor, f.amount)
        return factor

    def play(self) -> Iterator[tuple[int, dict[int, list[Span]]]]:
        """Yield (step, {rank: spans}) with true times shifted by each host's clock offset."""
        rng = random.Random(self.seed)
        layout = self.layout
        n = len(layout.ranks)
        hosts = sorted(layout.hosts())
        offsets = {h: rng.uniform(-self.max_clock_offset_s, self.max_clock_offset_s) for h in hosts}
        free = [1_700_000_000.0] * n
        seqs: dict[str, int] = {}
        jit = self.jitter_s

        def noise() -> float:
            return rng.random() * jit

        for step in range(self.steps):
            out = _StepSpans(
                self.job, step, n, {r.rank: offsets[r.host] for r in layout.ranks}, rng
            )
            emit = out.emit
            step_start = list(free)
            backward_start = [0.0] * n
            for r in range(n):
                spike = rng.random() * self.spike_s if rng.random() < self.spike_p else 0.0
                t0 = free[r] + noise()
                t1 = t0 + self.fetch_s + self._extra("data", step, r, rng)
                t2 = t1 + self.forward_s + self._extra("compute", step, r, rng) + noise() + spike
                t3 = t2 + self.backward_s + noise()
                emit(r, semconv.SPAN_DATALOADER_FETCH, t0, t1, {})
                emit(r, semconv.SPAN_FORWARD, t1, t2, {})
                backward_start[r] = t2
                free[r] = t3
                if any(g.async_bucket for g in layout.sequence):
                    free[r] = t2  # buckets launch during backward
            bucket_end: dict[tuple[str, int], float] = {}
            launched = [0] * n
            buckets = sum(1 for g in layout.sequence if g.async_bucket)
            for k, g in enumerate(layout.sequence):
                members = g.members
                arrive: list[float] = []
                for m in members:
                    if g.async_bucket:
                        launched[m] += 1
                        t = backward_start[m] + self.backward_s * launched[m] / buckets + noise()
                        arrive.append(t)
                    else:
                        arrive.append(free[m] + (self.gap_s + noise() if k > 0 else 0.0))
                net = list(arrive)
                if g.async_bucket:
                    # A bucket's transfer queues behind the group's previous one.
                    net = [
                        max(a, bucket_end.get((g.pg, m), 0.0))
                        for a, m in zip(arrive, members, strict=True)
                    ]
                transfer = g.transfer_s * self._link_factor(step, members) + noise() / 4
                end = max(net) + transfer
                seq = seqs.get(g.pg, 0)
                seqs[g.pg] = seq + 1
                for i, m in enumerate(members):
                    attrs: dict[str, object] = {
                        semconv.COLLECTIVE_OP: g.op,
                        semconv.COLLECTIVE_PG: g.pg,
                        semconv.COLLECTIVE_PG_SIZE: len(members),
                        semconv.COLLECTIVE_SEQ: seq,
                        semconv.COLLECTIVE_BYTES: g.nbytes,
                        semconv.COLLECTIVE_ASYNC: g.async_bucket,
                        semconv.COLLECTIVE_SOURCE: "ddp" if g.async_bucket else "api",
                        semconv.TIMING: "host",
                    }
                    member_end = end + i * 1e-6
                    name = semconv.SPAN_COLLECTIVE_PREFIX + g.op
                    if g.p2p:
                        src, dst = members
                        attrs[semconv.COLLECTIVE_SEQ] = seqs.get(f"{g.pg}:{src}>{dst}", 0)
                        if i == 1:
                            seqs[f"{g.pg}:{src}>{dst}"] = attrs[semconv.COLLECTIVE_SEQ] + 1  # type: ignore[operator]
                        attrs[semconv.COLLECTIVE_OP] = "send" if i == 0 else "recv"
                        attrs[semconv.COLLECTIVE_PEER] = dst if i == 0 else src
                        name = semconv.SPAN_COLLECTIVE_PREFIX + str(attrs[semconv.COLLECTIVE_OP])
                        member_end = (
                            arrive[0] + transfer
                            if i == 0
                            else max(arrive[1] + 50e-6, arrive[0] + transfer)
                        )
                    emit(m, name, arrive[i], member_end, attrs)
                    if g.async_bucket:
                        bucket_end[(g.pg, m)] = member_end
                    else:
                        free[m] = member_end
            for r in range(n):
                if buckets:
                    free[r] = max(
                        backward_start[r] + self.backward_s,
                        *(bucket_end.get((g.pg, r), 0.0) for g in layout.sequence),
                    )
                    emit(r, semconv.SPAN_BACKWARD, backward_start[r], free[r], {})
                else:
                    emit(
                        r,
                        semconv.SPAN_BACKWARD,
                        backward_start[r],
                        backward_start[r] + self.backward_s,
                        {},
                    )
                end = free[r] + self.optimizer_s + noise()
                emit(r, semconv.SPAN_OPTIMIZER_STEP, free[r], end, {})
                emit(r, semconv.SPAN_STEP, step_start[r], end, {})
                free[r] = end
            yield step, out.spans

    def resource(self, r: int) -> list[KeyValue]:
        rank = self.layout.ranks[r]
        return _kvs(
            {
                semconv.SERVICE_NAME: semconv.DEFAULT_SERVICE_NAME,
                semconv.SERVICE_INSTANCE_ID: f"{self.job}/{r}",
                semconv.JOB_ID: self.job,
                semconv.RANK: r,
                semconv.LOCAL_RANK: 0,
                semconv.WORLD_SIZE: len(self.layout.ranks),
                semconv.HOST_NAME: rank.host,
                semconv.SWITCH: rank.switch,
                semconv.NIC: rank.nic,
            }
        )

    def requests(self) -> Iterator[list[ExportTraceServiceRequest]]:
        """Waves of OTLP requests, one wave per step played: each rank flushes its spans
        every 1-3 steps (its own rhythm), and a wave's requests are shuffled."""
        rng = random.Random(self.seed + 1)
        n = len(self.layout.ranks)
        held: dict[int, list[Span]] = {r: [] for r in range(n)}
        due = {r: rng.randint(*self.batch_steps) for r in range(n)}
        for step, spans in self.play():
            wave: list[ExportTraceServiceRequest] = []
            for r in range(n):
                held[r].extend(spans[r])
                last = step == self.steps - 1
                if step + 1 >= due[r] or last:
                    wave.append(self._request(r, held[r]))
                    held[r] = []
                    due[r] = step + 1 + rng.randint(*self.batch_steps)
            rng.shuffle(wave)
            yield wave

    def _request(self, r: int, spans: list[Span]) -> ExportTraceServiceRequest:
        rs = ResourceSpans()
        rs.resource.attributes.extend(self.resource(r))
        ss = ScopeSpans()
        ss.scope.name = "skewtrace"
        ss.spans.extend(spans)
        rs.scope_spans.append(ss)
        return ExportTraceServiceRequest(resource_spans=[rs])


class _StepSpans:
    """The spans of one step, per rank, each rank's times shifted by its host's clock."""

    def __init__(
        self, job: str, step: int, ranks: int, offsets: dict[int, float], rng: random.Random
    ) -> None:
        self.step = step
        self.trace_id = step_trace_id(job, step).to_bytes(16, "big")
        self.offsets = offsets
        self.rng = rng
        self.spans: dict[int, list[Span]] = {r: [] for r in range(ranks)}

    def emit(self, r: int, name: str, t0: float, t1: float, attrs: dict[str, object]) -> None:
        off = self.offsets[r]
        span = Span(
            trace_id=self.trace_id,
            span_id=self.rng.getrandbits(64).to_bytes(8, "big"),
            name=name,
            kind=Span.SPAN_KIND_INTERNAL,
            start_time_unix_nano=int((t0 + off) * 1e9),
            end_time_unix_nano=int((t1 + off) * 1e9),
        )
        span.attributes.extend(_kvs({semconv.STEP: self.step, **attrs}))
        self.spans[r].append(span)


def _kvs(attrs: dict[str, object]) -> list[KeyValue]:
    out = []
    for key, value in attrs.items():
        if isinstance(value, bool):
            v = AnyValue(bool_value=value)
        elif isinstance(value, int):
            v = AnyValue(int_value=value)
        elif isinstance(value, float):
            v = AnyValue(double_value=value)
        else:
            v = AnyValue(string_value=str(value))
        out.append(KeyValue(key=key, value=v))
    return out


def _ranks_on(layout: Layout, *hosts: str) -> list[int]:
    return [r.rank for r in layout.ranks if r.host in hosts]


def _stable_seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")


def build_scenarios() -> dict[str, Scenario]:
    """The table: every fault kind on the layouts where it applies, and healthy runs."""
    out: dict[str, Scenario] = {}

    def add(s: Scenario) -> None:
        s.seed = _stable_seed(s.name)
        out[s.name] = s

    for name in ("2d", "hier", "3d", "ddp", "pairs"):
        add(Scenario(f"healthy-{name}", LAYOUTS[name](), [], jitter_s=2 * MS))
    l2 = layout_2d()
    add(
        Scenario(
            "data-2d",
            l2,
            [Fault("data", (5,), 30 * MS, start=8)],
            expected=Expected({5: semconv.CAUSE_DATA}),
        )
    )
    add(
        Scenario(
            "compute-2d",
            l2,
            [Fault("compute", (11,), 25 * MS, start=8)],
            expected=Expected({11: semconv.CAUSE_COMPUTE}),
        )
    )
    add(
        Scenario(
            "compute-from-0-hier",
            layout_hierarchical(),
            [Fault("compute", (9,), 25 * MS)],
            expected=Expected({9: semconv.CAUSE_COMPUTE}),
        )
    )
    add(
        Scenario(
            "compute-ends-2d",
            l2,
            [Fault("compute", (2,), 30 * MS, start=8, end=24)],
            expected=Expected({2: semconv.CAUSE_COMPUTE}),
        )
    )
    for start, label in ((10, ""), (0, "-from-0")):
        add(
            Scenario(
                f"nic-3x{label}-2d",
                l2,
                [Fault("nic", ("node3",), 3.0, start=start)],
                expected=Expected(
                    {r: semconv.CAUSE_NETWORK for r in _ranks_on(l2, "node3")},
                    {"nic:node3/eth0"},
                ),
            )
        )
    lh = layout_hierarchical()
    add(
        Scenario(
            "nic-3x-hier",
            lh,
            [Fault("nic", ("node5",), 3.0, start=8)],
            expected=Expected(
                {r: semconv.CAUSE_NETWORK for r in _ranks_on(lh, "node5")}, {"nic:node5/eth0"}
            ),
        )
    )
    lp = layout_pairs()
    add(
        Scenario(
            "uplink-4x-pairs",
            lp,
            [Fault("uplink", ("leaf2",), 4.0, start=8)],
            expected=Expected({}, {"uplink:leaf2"}),
        )
    )
    rack = _ranks_on(l2, "node2", "node3")
    add(
        Scenario(
            "rack-2d",
            l2,
            [Fault("compute", tuple(rack), 20 * MS, start=8)],
            expected=Expected({r: semconv.CAUSE_COMPUTE for r in rack}, {"switch:leaf1"}),
        )
    )
    hetero = _ranks_on(l2, "node6")
    add(
        Scenario(
            "hetero-node-2d",
            l2,
            [Fault("compute", tuple(hetero), 20 * MS)],
            expected=Expected({r: semconv.CAUSE_COMPUTE for r in hetero}, {"host:node6"}),
        )
    )
    add(
        Scenario(
            "jitter-3-ranks-2d",
            l2,
            [Fault("jitter", (1, 6, 13), 40 * MS, start=8)],
            expected=Expected({}, set(), allowed={1, 6, 13}),
        )
    )
    l3 = layout_3d()
    add(
        Scenario(
            "pp-stage-3d",
            l3,
            [Fault("compute", (12,), 30 * MS, start=8)],
            expected=Expected({12: semconv.CAUSE_COMPUTE}),
        )
    )
    add(
        Scenario(
            "data-3d",
            l3,
            [Fault("data", (21,), 30 * MS, start=8)],
            expected=Expected({21: semconv.CAUSE_DATA}),
        )
    )
    ld = layout_ddp()
    add(
        Scenario(
            "compute-ddp",
            ld,
            [Fault("compute", (2,), 25 * MS, start=8)],
            expected=Expected({2: semconv.CAUSE_COMPUTE}),
        )
    )
    return out


SCENARIOS = build_scenarios()
