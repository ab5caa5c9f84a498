"""Which changes the job could have waited on, and whether the timeline agrees with the
Collector's verdicts.

A component is a candidate cause only when the job could have waited on it: its host's ranks
show the matching wait in their own series, or the Collector's diagnosis names it. On a real
cluster a checkpoint, a log rotation or a neighbour's job changes some disk or link every few
minutes; without this rule the earliest of those is named first.

- a block device (or volume) of a host: a rank on that host waited longer for its batches
  (its ``training.dataloader.wait`` rose) or moved more data itself (``process.io`` rose),
  at about the same time (:data:`~skewtrace.timeline.first_change.LINK_INTERVALS` sampling
  intervals), or the Collector flags a rank of that host for its data. The wait and the flag
  count only where the host's ranks read from storage at all (their ``process.io`` reads, in
  at least ``min_after`` samples of the window): a loader that waits on its CPU-bound
  workers or the network does not wait on a local disk that a neighbour keeps busy;
- a rank's own I/O: that rank's data-loader wait rose, or the Collector flags it for its data;
- a NIC, a host's TCP stack, a switch: the Collector suspects that NIC, host, switch or
  uplink (or the switch or uplink its host is behind), or flags a rank behind it for its
  network; where the Collector located nothing in the network, the transfers of the job's
  collectives rose (the collectives cross the regressed ranks' links). Where it did locate the
  slow transfers, the other hosts' NICs are not on the path: their counters move because the
  job's traffic changed shape (a ring waits for its slowest link), not because they slowed it;
- a GPU: its host holds a regressed rank, or the Collector flags a rank there for compute;
- the job's own waits (data loader, collective transfer) and the step: always.

Changes elsewhere are listed apart ("also changed") and never lead the order of causes.

A flag counts only when the replay says it cost a material share of the regression
(:data:`MATERIAL_SHARE` of the step-time rise): a rank flagged for 6 ms per step while the
step rose by 180 ms cannot be what the job waited on, and its host's counters are no cause.
It counts only when it was held for a material share of the samples of the most persistent
flag, too. A flag's cost is what the rank cost at the samples it was flagged for that cause
(the rank's cost series has no cause): a compute straggler flagged for its network for a
moment before its fault cost 6 ms a step then, not its compute's 100 ms; where the two
series share no sample, the rank's largest cost in the window.
Likewise a suspect counts only when it was suspected for a material share of the samples of
the most persistent suspect, and a NIC or host only where, if ranks of its host are flagged,
one of them is flagged for its network materially.

The diagnosis is read from the same store: ``training_straggler_ratio`` (flagged ranks with
their host and cause) and ``training_fabric_suspect_ratio`` (suspected NICs, hosts, uplinks,
switches) at 1 at any sample of the window, with what the step replay says each flagged rank
cost (``training_rank_cost_seconds``) and the job's slowdown (``training_job_slowdown_ratio``).
:func:`agreement` says whether the first change on the path is what the Collector concluded,
and shows both where not.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from skewtrace import semconv
from skewtrace.timeline import signals as sig
from skewtrace.timeline.source import Form, Query, SeriesSource

STRAGGLERS = Query(semconv.PROM_STRAGGLER, Form.GAUGE)
SUSPECTS = Query(semconv.PROM_FABRIC_SUSPECT, Form.GAUGE)
RANK_COSTS = Query(semconv.PROM_RANK_COST, Form.GAUGE)
IMBALANCES = Query(semconv.PROM_IMBALANCE, Form.GAUGE)
SLOWDOWN = Query(semconv.PROM_JOB_SLOWDOWN, Form.GAUGE)

MATERIAL_SHARE = 0.25
"""A flagged rank puts its host on the job's path only when its replayed cost per step is at
least this share of the step-time rise (or its cost was not read)."""

_NETWORK_KINDS = (semconv.COMPONENT_NIC, semconv.COMPONENT_HOST, semconv.COMPONENT_SWITCH)
_SUSPECT_KIND = sig.label(semconv.SUSPECT_KIND)
_SUSPECT_NAME = sig.label(semconv.SUSPECT_NAME)
_CAUSE = sig.label(semconv.STRAGGLER_CAUSE)
_STAGE = sig.label(semconv.PIPELINE_STAGE)


@dataclass(frozen=True)
class Flag:
    """A rank the Collector flagged in the window."""

    rank: int
    host: str
    switch: str
    cause: str
    cost_s: float = 0.0
    """The most the replay said the rank cost per step in the window (0: not read)."""
    samples: int = field(default=0, compare=False)
    """At how many samples of the window the Collector flagged it for this cause (0: not
    read)."""


@dataclass(frozen=True)
class Suspect:
    """A part of the fabric the Collector suspected in the window."""

    kind: str
    name: str
    host: str
    samples: int = field(default=0, compare=False)
    """At how many samples of the window the Collector suspected it (0: not read)."""

    @property
    def key(self) -> str:
        return f"nic:{self.host}/{self.name}" if self.kind == "nic" else f"{self.kind}:{self.name}"


@dataclass(frozen=True)
class Diagnosis:
    """The Collector's verdicts over the window."""

    flags: tuple[Flag, ...] = ()
    suspects: tuple[Suspect, ...] = ()
    slowdown: float | None = None
    """The job's largest replayed slowdown in the window (``training.job.slowdown``)."""
    imbalances: tuple[tuple[str, str], ...] = ()
    """(cause, stage) of the imbalances flagged in the window (``training.imbalance``): a
    pipeline stage longer than the others, or data that varies per step; no component is
    their cause."""

    @property
    def empty(self) -> bool:
        return not self.flags and not self.suspects and not self.imbalances

    def material(self, step_rise_s: float) -> Diagnosis:
        """The verdicts that count against a step-time rise of ``step_rise_s`` (0: unknown,
        every flag counts): flags whose replayed cost is at least MATERIAL_SHARE of the rise
        (or was not read) and that were held for at least MATERIAL_SHARE as many samples as
        the most persistent flag, and suspects held for at least MATERIAL_SHARE as many
        samples as the most persistent one and, for a NIC or host whose ranks are flagged,
        with a material network flag among them (a link suspected for a moment, one whose
        ranks cost 4 ms of a 180 ms rise, or one whose ranks the Collector flags for their
        own compute, is not where the job waited).

        A flag's cost is its rank's while flagged for that cause (:func:`read_diagnosis`);
        where it was flagged for two causes at once, both carry that cost, and only the
        flags' persistence tells the one that held."""
        most_flagged = max((f.samples for f in self.flags), default=0)

        def counts(flag: Flag) -> bool:
            if flag.samples > 0 and flag.samples < MATERIAL_SHARE * most_flagged:
                return False
            if flag.cost_s <= 0 or step_rise_s <= 0:
                return True
            return flag.cost_s >= MATERIAL_SHARE * step_rise_s

        most = max((s.samples for s in self.suspects), default=0)
        suspects = []
        for s in self.suspects:
            if s.samples < MATERIAL_SHARE * most:
                continue
            if s.kind in ("nic", "host"):
                # Where ranks of its host are flagged, one of them must be flagged for its
                # network, materially: a compute straggler whose host's NIC was suspected for
                # a moment (another process took its CPU while it sent) did not wait on it.
                there = [f for f in self.flags if f.host == (s.host or s.name)]
                if there and not any(counts(f) and f.cause == semconv.CAUSE_NETWORK for f in there):
                    continue
            suspects.append(s)
        return replace(
            self,
            flags=tuple(f for f in self.flags if counts(f)),
            suspects=tuple(suspects),
        )

    def describe(self) -> str:
        parts = [
            f"rank {f.rank} {f.cause} (on {f.host}"
            + (f", {f.cost_s * 1e3:.0f} ms per step" if f.cost_s > 0 else "")
            + ")"
            for f in self.flags
        ]
        parts += [s.key for s in self.suspects]
        parts += [
            f"stage {stage} imbalanced" if cause == semconv.CAUSE_STAGE_IMBALANCE else cause
            for cause, stage in self.imbalances
        ]
        return ", ".join(parts) if parts else "nothing"

    def to_json(self) -> dict[str, Any]:
        return {
            "flagged": [
                {
                    "rank": f.rank,
                    "host": f.host,
                    "switch": f.switch,
                    "cause": f.cause,
                    "cost_s": f.cost_s,
                }
                for f in self.flags
            ],
            "suspects": [s.key for s in self.suspects],
            "imbalances": [{"cause": c, "stage": st} for c, st in self.imbalances],
            "slowdown": self.slowdown,
        }


def read_diagnosis(source: SeriesSource, job: str, start: float, end: float) -> Diagnosis:
    """The ranks flagged and the parts of the fabric suspected at any sample in [start, end]."""
    cost_at: dict[str, dict[float, float]] = {}
    for series in source.series(RANK_COSTS, job, start, end):
        rank = series.labels.get(sig.RANK, "")
        at = cost_at.setdefault(rank, {})
        for t, v in zip(series.times, series.values, strict=False):
            if v == v and v != float("inf"):
                at[t] = max(at.get(t, 0.0), v)
    slowdowns = [
        v
        for series in source.series(SLOWDOWN, job, start, end)
        for v in series.values
        if v == v and v != float("inf")
    ]
    flags: dict[Flag, int] = {}
    for series in source.series(STRAGGLERS, job, start, end):
        rank = series.labels.get(sig.RANK, "")
        flagged_at = [t for t, v in zip(series.times, series.values, strict=False) if v >= 1]
        if flagged_at and rank.isdigit():
            # The rank's cost while it was flagged for this cause (a compute straggler flagged
            # for its network for a moment before its fault did not cost then what its
            # compute cost later); its largest in the window where the two series do not
            # share a sample.
            at = cost_at.get(rank, {})
            while_flagged = [at[t] for t in flagged_at if t in at]
            flag = Flag(
                int(rank),
                series.labels.get(sig.HOST, ""),
                series.labels.get(sig.SWITCH, ""),
                series.labels.get(_CAUSE, ""),
                max(while_flagged or at.values(), default=0.0),
            )
            flags[flag] = max(flags.get(flag, 0), len(flagged_at))
    suspects: dict[Suspect, int] = {}
    for series in source.series(SUSPECTS, job, start, end):
        samples = sum(1 for v in series.values if v >= 1)
        if samples:
            suspect = Suspect(
                series.labels.get(_SUSPECT_KIND, ""),
                series.labels.get(_SUSPECT_NAME, ""),
                series.labels.get(sig.HOST, ""),
            )
            suspects[suspect] = max(suspects.get(suspect, 0), samples)
    imbalances = {
        (series.labels.get(_CAUSE, ""), series.labels.get(_STAGE, ""))
        for series in source.series(IMBALANCES, job, start, end)
        if any(v >= 1 for v in series.values)
    }
    return Diagnosis(
        tuple(
            sorted(
                (replace(f, samples=n) for f, n in flags.items()), key=lambda f: (f.rank, f.cause)
            )
        ),
        tuple(sorted((replace(s, samples=n) for s, n in suspects.items()), key=lambda s: s.key)),
        max(slowdowns) if slowdowns else None,
        tuple(sorted(imbalances)),
    )


def host_of(component: str) -> str:
    """The host of a ``<host>/<part>`` component (a switch's name is its own)."""
    return component.split("/", 1)[0]


@dataclass(frozen=True)
class JobPath:
    """The evidence that the job waited on something, and the rule per kind of component."""

    loader_ranks: Mapping[str, float]
    """``<host>/rank<r>`` of the ranks whose data-loader wait rose, with when it rose."""
    io_hosts: Mapping[str, tuple[float, ...]]
    """Hosts whose ranks' own I/O rose, with when."""
    transfers: bool
    """A process group's collective transfer rose."""
    regressed_hosts: frozenset[str]
    diagnosis: Diagnosis
    """The Collector's verdicts that count against the step-time rise
    (:meth:`Diagnosis.material`)."""
    switch_of: Mapping[str, str]
    link_s: float = math.inf
    """How far apart a component's change and the wait it explains may be dated: a disk that
    changed 10 s before a rank's loader wait rose did not make it rise."""
    unread_hosts: frozenset[str] = frozenset()
    """Hosts whose ranks read nothing from storage in the window (their ``process.io`` reads;
    a host without that series is not among them): a block device there cannot have kept
    their batches waiting, whatever it did then."""

    @classmethod
    def of(
        cls,
        changes: Iterable[Any],
        regressed_hosts: Iterable[str],
        diagnosis: Diagnosis,
        switch_of: Mapping[str, str],
        step_rise_s: float = 0.0,
        link_s: float = math.inf,
        unread_hosts: Iterable[str] = (),
    ) -> JobPath:
        loader: dict[str, float] = {}
        io: dict[str, list[float]] = {}
        transfers = False
        for c in changes:
            at = c.onset - c.lag_s
            if c.kind == semconv.COMPONENT_DATALOADER and not c.effect:
                loader[c.component] = at
            elif (
                c.kind == semconv.COMPONENT_DISK
                and c.signal.startswith(semconv.METRIC_PROCESS_IO)
                and c.after > c.before
            ):
                # Only a rank that reads or writes more puts its host's disk on the path: one
                # that reads less because its steps slowed (or its volume was throttled, which
                # its loader wait shows) adds nothing to the disk's load.
                io.setdefault(host_of(c.component), []).append(at)
            elif c.kind == semconv.COMPONENT_COLLECTIVE and not c.effect:
                transfers = True
        return cls(
            loader,
            {h: tuple(v) for h, v in io.items()},
            transfers,
            frozenset(regressed_hosts),
            diagnosis.material(step_rise_s),
            dict(switch_of),
            link_s,
            frozenset(unread_hosts),
        )

    def _linked(self, change: Any, at: float) -> bool:
        return abs(change.onset - change.lag_s - at) <= self.link_s

    def _flagged_on(self, host: str, *causes: str) -> bool:
        return any(f.host == host and f.cause in causes for f in self.diagnosis.flags)

    def _network_located(self) -> bool:
        """Whether the Collector located the slow transfers: a suspect, or a flag for the
        network (both of a material share)."""
        return bool(self.diagnosis.suspects) or any(
            f.cause == semconv.CAUSE_NETWORK for f in self.diagnosis.flags
        )

    def why(self, change: Any) -> str | None:
        """Why the job could have waited on ``change``'s component, or None."""
        kind, component = change.kind, change.component
        host = host_of(component)
        if kind in (
            semconv.COMPONENT_STEP,
            semconv.COMPONENT_DATALOADER,
            semconv.COMPONENT_COLLECTIVE,
        ):
            return "the job's own wait"
        if kind == semconv.COMPONENT_DISK:
            own_io = change.signal.startswith(semconv.METRIC_PROCESS_IO)
            # A host's block device feeds its ranks' batches only if they read from storage.
            feeds = own_io or host not in self.unread_hosts
            if (
                own_io
                and component in self.loader_ranks
                and self._linked(change, self.loader_ranks[component])
            ):
                return "its rank's data-loader wait rose"
            if (
                not own_io
                and feeds
                and any(
                    host_of(r) == host and self._linked(change, at)
                    for r, at in self.loader_ranks.items()
                )
            ):
                return "a rank on its host waited longer for its batches"
            if not own_io and any(self._linked(change, at) for at in self.io_hosts.get(host, ())):
                return "a rank on its host reads or writes more"
            if feeds and self._flagged_on(host, semconv.CAUSE_DATA):
                return "the Collector flags a rank on its host for its data"
            return None
        if kind in _NETWORK_KINDS:
            hosts = {host_of(m) for m in change.members} or {host}
            if kind == semconv.COMPONENT_SWITCH:
                hosts |= {h for h, s in self.switch_of.items() if s == component}
            for s in self.diagnosis.suspects:
                if s.kind in ("switch", "uplink") and (
                    s.name == component or any(self.switch_of.get(h) == s.name for h in hosts)
                ):
                    return f"the Collector suspects {s.key}"
                if s.kind in ("nic", "host") and (s.host or s.name) in hosts:
                    return f"the Collector suspects {s.key}"
            if any(self._flagged_on(h, semconv.CAUSE_NETWORK) for h in hosts):
                return "the Collector flags a rank behind it for its network"
            if self.transfers and not self._network_located():
                return "the job's collective transfers rose"
            return None
        if kind == semconv.COMPONENT_GPU:
            if host in self.regressed_hosts:
                return "its host holds a rank whose step time rose"
            if self._flagged_on(host, semconv.CAUSE_COMPUTE):
                return "the Collector flags a rank on its host for compute"
            return None
        return None


def agreement(
    first: Any | None, diagnosis: Diagnosis, step_rise_s: float = 0.0
) -> tuple[bool | None, str]:
    """Whether the first cause on the job's path (None: none before the step) is what the
    Collector concluded over the window, and why; None when the Collector concluded nothing.
    Only flags of a material share of the step-time rise (``step_rise_s``) are weighed: a rank
    flagged for its network at 6 ms a step beside a 100 ms compute straggler does not make the
    Collector's conclusion the network."""
    if diagnosis.empty:
        return None, "the Collector flagged no rank and suspected no part of the fabric"
    said = f"the Collector flags {diagnosis.describe()}"
    counted = diagnosis.material(step_rise_s)
    if first is None:
        own_work = all(
            f.cause in (semconv.CAUSE_COMPUTE, semconv.CAUSE_DATA) for f in counted.flags
        )
        if own_work and not counted.suspects:
            return True, (
                f"agrees: no component on the job's path changed, and {said}: the ranks' own "
                "work or its balance"
            )
        return False, f"differs: no component on the job's path changed, but {said}"
    kind, host = first.kind, host_of(first.component)
    flagged = {(f.host, f.cause) for f in counted.flags}
    match = False
    if kind in _NETWORK_KINDS:
        names = {first.component, host} | {host_of(m) for m in first.members}
        match = any(s.name in names or s.host in names for s in diagnosis.suspects) or any(
            (h, semconv.CAUSE_NETWORK) in flagged for h in names
        )
    elif kind == semconv.COMPONENT_COLLECTIVE:
        match = bool(diagnosis.suspects) or any(
            f.cause == semconv.CAUSE_NETWORK for f in diagnosis.flags
        )
    elif kind in (semconv.COMPONENT_DISK, semconv.COMPONENT_DATALOADER):
        match = (host, semconv.CAUSE_DATA) in flagged
    elif kind == semconv.COMPONENT_GPU:
        match = (host, semconv.CAUSE_COMPUTE) in flagged
    where = f"{first.component} ({kind})"
    if match:
        return True, f"agrees: the first change is {where}, and {said}"
    return False, f"differs: the first change is {where}, but {said}"
