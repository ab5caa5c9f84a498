"""What the report shows, as plain data: built by :mod:`.collect`, drawn by :mod:`.page`.

Times are seconds (float) everywhere here; the page turns them into milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class InfoTable:
    """A small table for the run-info block (e.g. CV and throughput with pacing off and on)."""

    title: str
    columns: list[str]
    rows: list[list[str]]

    def __post_init__(self) -> None:
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(
                    f"InfoTable {self.title!r}: rows[{i}] has {len(row)} cells, "
                    f"columns has {len(self.columns)}"
                )


@dataclass
class RunInfo:
    """What the caller knows about the run, shown at the top of the report as given.

    Every field is optional; an empty RunInfo shows nothing.
    """

    title: str = "Run"
    """Heading of the block."""
    injected: list[str] = field(default_factory=list)
    """What was done to the job on purpose (``"rank 2: +40 ms compute from step 10"``)."""
    concluded: list[str] = field(default_factory=list)
    """What skewtrace concluded (``"rank 2 flagged, cause compute, at step 14"``)."""
    figures: list[tuple[str, str]] = field(default_factory=list)
    """Key/value pairs (``("steps to conclude", "4")``, ``("seconds to conclude", "1.9")``)."""
    tables: list[InfoTable] = field(default_factory=list)
    """Small tables (``pacing off/on`` against ``CV``, ``throughput``)."""
    notes: list[str] = field(default_factory=list)
    """Free text, one paragraph each."""

    def __post_init__(self) -> None:
        for i, pair in enumerate(self.figures):
            if not (isinstance(pair, tuple | list) and len(pair) == 2):
                raise ValueError(f"RunInfo.figures[{i}] must be a (key, value) pair, got {pair!r}")

    def empty(self) -> bool:
        return not (self.injected or self.concluded or self.figures or self.tables or self.notes)


@dataclass(frozen=True)
class RankInfo:
    """A rank's place in the fabric, from its resource attributes."""

    rank: int
    host: str
    switch: str
    nic: str
    worker: str = ""
    """Which worker an imported what-if rank stands for ("stage 1, replica 1, GPUs 40-47"),
    from ``training.worker.*``; empty for a rank process."""


@dataclass(frozen=True)
class RankVerdict:
    """A rank named by a summary: a root cause of one step, or a flag after it."""

    rank: int
    host: str
    switch: str
    nic: str
    cause: str
    cost_s: float
    """A root cause: this step's seconds; a flag: the moving average per step."""
    domain: str = ""
    """``nic:<host>/<nic>``, ``switch:<name>``, ``host:<name>`` when a suspect holds it."""
    before: str = ""
    """With cause ``host_work``: the span the rank's own time outside every phase preceded."""


@dataclass(frozen=True)
class FabricSuspect:
    """A suspected part of the fabric, or a link root cause of one step."""

    kind: str
    name: str
    host: str
    cost_s: float
    derived: bool = False

    @property
    def key(self) -> str:
        """As ``training.straggler.domain`` names it: ``nic:<host>/<nic>``, ``switch:<name>``."""
        if self.kind == "nic" and self.host:
            return f"nic:{self.host}/{self.name}"
        return f"{self.kind}:{self.name}"


@dataclass(frozen=True)
class Partition:
    """The layers per stage the Collector advises for a heavy stage
    (``training.imbalance.partition*``)."""

    layers: tuple[int, ...]
    """Advised layers per stage, stages in order."""
    current: tuple[int, ...]
    """Layers per stage now."""
    before_s: tuple[float, ...]
    """Each stage's layer seconds per step now (forward plus backward, all micro-batches)."""
    after_s: tuple[float, ...]
    """Each stage's layer seconds per step under the advice."""
    saving_s: float
    """What the step replay says the advice saves per step."""

    @property
    def split_points(self) -> tuple[int, ...]:
        """Each stage's first layer after stage 0 (``--split-points``)."""
        return split_points(self.layers)

    @property
    def current_points(self) -> tuple[int, ...]:
        return split_points(self.current)


def split_points(layers: tuple[int, ...]) -> tuple[int, ...]:
    """Each stage's first layer after stage 0, from the layers per stage."""
    out, at = [], 0
    for n in layers[:-1]:
        at += n
        out.append(at)
    return tuple(out)


@dataclass(frozen=True)
class Imbalance:
    """A ``stage_imbalance`` or ``data_imbalance`` of the job (a root cause without a rank, or
    a flagged ``training.imbalance``)."""

    cause: str
    stage: int | None
    ranks: str
    excess: float
    cost_s: float
    fix: str
    partition: Partition | None = None
    """A ``stage_imbalance``'s advised partition of the layers (from the ranks' layer
    profiles; None without them)."""


@dataclass
class StepSummary:
    """One ``train.step.summary`` span."""

    step: int
    trace_id: str
    duration_s: float
    whatif_s: float
    slowdown: float
    ranks: int
    slow_collectives: int
    min_saving_s: float = 0.0
    """The least a rank or a link had to save in the step to be named a root cause
    (``training.step.min_saving``; 0 where the summary did not say)."""
    root_causes: list[RankVerdict] = field(default_factory=list)
    link_causes: list[FabricSuspect] = field(default_factory=list)
    flags: list[RankVerdict] = field(default_factory=list)
    suspects: list[FabricSuspect] = field(default_factory=list)
    imbalance_causes: list[Imbalance] = field(default_factory=list)
    imbalances: list[Imbalance] = field(default_factory=list)
    attribution: dict[str, float] = field(default_factory=dict)
    """Seconds fixing each kind of work alone would save in the step (``training.attribution``
    events: ``compute`` or a collective op)."""

    @property
    def flagged(self) -> frozenset[int]:
        return frozenset(f.rank for f in self.flags)


@dataclass(frozen=True)
class FlagChange:
    """A rank or suspect flagged (``set``) or cleared after a step."""

    step: int
    what: str
    """``rank 11`` or a suspect key."""
    kind: str
    """``set`` or ``cleared``."""
    rank: int | None = None


@dataclass(frozen=True)
class Segment:
    """One bar of the waterfall, in seconds from the step's origin on the aligned timeline."""

    kind: str
    """One of :data:`SEGMENT_KINDS`."""
    start_s: float
    end_s: float
    label: str
    """The span's name (``collective.all_reduce pg=tp2``)."""
    detail: str = ""
    """Tooltip text."""


# Drawn in this order; the legend lists them in this order.
SEGMENT_KINDS = (
    "step",
    "fetch",
    "forward",
    "backward",
    "optimizer",
    "pacing",
    "other",
    "collective",
    "wait",
)


@dataclass
class RankRow:
    """One rank's row of the waterfall."""

    info: RankInfo
    segments: list[Segment]
    clock_offset_s: float | None
    """What was subtracted from the rank's timestamps; None: no collective to align it by."""
    flagged: bool
    """Flagged in the last summary (the verdict)."""
    root_cause: bool
    """A root cause of the step shown."""
    lateness_s: float = 0.0
    """Sum of the rank's ``training.barrier.lateness`` in the step."""


@dataclass
class Waterfall:
    """The step drawn as a waterfall."""

    step: int
    duration_s: float
    chosen_by: str
    """Why this step: ``summary`` (largest ``training.step.duration``), ``root``,
    ``rank`` (longest ``train.step``), or ``requested``."""
    rows: list[RankRow]
    extent_s: float
    hidden_ranks: int = 0
    """Ranks of the step not drawn (past ``max_rows``)."""
    unaligned_ranks: int = 0


@dataclass
class Verdict:
    """A flagged rank of the last summary, with the step it was first flagged at."""

    flag: RankVerdict
    first_step: int
    since_step: int
    """Start of the current run of flagged steps (later than first_step after a clear)."""


@dataclass
class SuspectVerdict:
    suspect: FabricSuspect
    first_step: int
    since_step: int


@dataclass
class Series:
    """Per-step figures for the charts."""

    skew_max_s: dict[int, float] = field(default_factory=dict)
    """The largest ``training.barrier.skew`` among the step's collectives."""
    lateness_s: dict[int, dict[int, float]] = field(default_factory=dict)
    """rank -> step -> sum of the rank's ``training.barrier.lateness`` in the step."""
    step_duration_s: dict[int, float] = field(default_factory=dict)
    """From summaries (the analysis' timeline)."""
    step_whatif_s: dict[int, float] = field(default_factory=dict)


@dataclass
class ReportStats:
    """What :func:`skewtrace.report.write_report` read and concluded."""

    job_id: str
    out_path: Path | None
    ranks: int
    hosts: int
    switches: int
    steps_seen: int
    steps_analyzed: int
    worst_step: int | None
    worst_step_duration_s: float | None
    flagged: dict[int, str]
    """rank -> cause, from the last summary."""
    suspects: list[str]
    spans_read: int
    malformed_lines: int
    malformed_spans: int
    html_bytes: int = 0


@dataclass
class ReportData:
    """Everything the page shows."""

    job_id: str
    source: str
    ranks: dict[int, RankInfo]
    steps_seen: int
    first_step: int | None
    last_step: int | None
    summaries: dict[int, StepSummary]
    series: Series
    changes: list[FlagChange]
    verdicts: list[Verdict]
    suspects: list[SuspectVerdict]
    last_summary: StepSummary | None
    waterfall: Waterfall | None
    run_info: RunInfo | None
    spans_read: int
    malformed_lines: int
    malformed_spans: int
    other_jobs: list[str] = field(default_factory=list)
    balance_modes: dict[int, str] = field(default_factory=dict)
    """Step -> ``training.balance.mode`` of its ``dataloader.fetch`` spans (``work`` or
    ``count``; ``mixed`` where ranks disagree), for steps of a work-balanced sampler."""
    step_time_s: dict[int, float] = field(default_factory=dict)
    """Step -> the longest ``train.step`` of any rank (the job's step time)."""

    @property
    def hosts(self) -> list[str]:
        return sorted({r.host for r in self.ranks.values()})

    @property
    def switches(self) -> list[str]:
        return sorted({r.switch for r in self.ranks.values()})

    @property
    def flagged(self) -> dict[int, str]:
        return {v.flag.rank: v.flag.cause for v in self.verdicts}
