"""The what-if corpus through the built Collector, against the reference replay (issue 45).

Every job of ``tests/whatif/corpus.py`` is generated (deterministic seeds), written as the
what-if analysis' own CSV and metadata, read back by ``skewtrace import``'s reader, and its
spans played through one real ``otelcol-skewtrace`` (``tests/span_replay.py``: requests in
order, each step analysed once every rank of its world ended it, the Collector stopped to
drain; nothing timed decides a verdict). The Collector's step summaries are compared with
``tests/whatif/oracle.py``, a replay written apart from the Collector's engine:

- each step's slowdown (``training.step.duration`` over ``training.step.whatif``) within a
  tenth of the oracle's excess: ``|S - S_oracle| <= 0.1 x (S_oracle - 1) + 0.02``;
- each step's root causes exactly the oracle's: the ranks (workers) with their cause, the
  stages (``stage_imbalance``), the data (``data_imbalance``);
- the flags after each step exactly the oracle's answers passed through the Collector's
  hysteresis (a name in ``flag_k`` of the last ``flag_window`` steps, the latest among
  them; cleared after ``clear_steps`` steps without it, its namings before then forgotten;
  a job's first ``warmupSteps`` steps vote for nothing), with the link's NIC suspected
  where a link is named. The
  constants are read from the Collector's Go sources, never copied here.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from skewtrace import semconv
from skewtrace.importer.whatif import read_whatif
from skewtrace.report.collect import parse_summary
from skewtrace.report.model import StepSummary
from skewtrace.report.spans import read_file_export
from span_replay import Request, collector_constant, collector_default, replay, requests_of_job
from whatif.corpus import CORPUS
from whatif.generate import GENERATOR_VERSION, Job, generate, write_csv, write_metadata
from whatif.oracle import StepAnswer, analyze

pytestmark = [pytest.mark.collector, pytest.mark.slow]


@dataclass
class Played:
    job: Job
    answers: list[StepAnswer]
    summaries: dict[int, StepSummary]


def _requests(name: str, job: Job, workdir: Path, per_rank: bool = False) -> list[Request]:
    write_csv(job, workdir / f"{name}.csv")
    write_metadata(job, workdir / f"{name}.json")
    imported = read_whatif(
        [workdir / f"{name}.csv"], job_id=name, meta=workdir / f"{name}.json", time_unit="us"
    )
    return requests_of_job(imported, per_rank=per_rank)


@pytest.fixture(scope="module")
def played(otelcol_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Played]:
    """Every corpus job through one Collector (a job per job id, one after the other)."""
    workdir = tmp_path_factory.mktemp("whatif-corpus")
    jobs = {name: generate(spec) for name, spec in CORPUS.items()}
    requests = [r for name, job in jobs.items() for r in _requests(name, job, workdir)]
    summaries = replay(otelcol_path, requests, workdir / "collector")
    return {
        name: Played(job, analyze(job.rows, job.metadata), summaries.get(name, {}))
        for name, job in jobs.items()
    }


def _named(summary: StepSummary) -> tuple[dict[int, str], set[int], bool]:
    ranks = {rc.rank: rc.cause for rc in summary.root_causes}
    stages = {
        im.stage
        for im in summary.imbalance_causes
        if im.cause == semconv.CAUSE_STAGE_IMBALANCE and im.stage is not None
    }
    data = any(im.cause == semconv.CAUSE_DATA_IMBALANCE for im in summary.imbalance_causes)
    return ranks, stages, data


@pytest.mark.parametrize("name", list(CORPUS))
def test_every_step_is_analysed_with_every_rank(played: dict[str, Played], name: str) -> None:
    run = played[name]
    workers = run.job.metadata["dp_size"] * run.job.metadata["pp_size"]
    assert sorted(run.summaries) == [a.step for a in run.answers]
    assert {s.ranks for s in run.summaries.values()} == {workers}


@pytest.mark.parametrize("name", list(CORPUS))
def test_slowdown_is_the_oracles_within_a_tenth_of_its_excess(
    played: dict[str, Played], name: str
) -> None:
    run = played[name]
    off = []
    for answer in run.answers:
        summary = run.summaries[answer.step]
        slowdown = summary.duration_s / summary.whatif_s
        if abs(slowdown - answer.slowdown) > 0.1 * (answer.slowdown - 1) + 0.02:
            off.append(f"step {answer.step}: {slowdown:.3f}, oracle {answer.slowdown:.3f}")
    assert not off, f"{name} ({GENERATOR_VERSION}): " + "; ".join(off)


@pytest.mark.parametrize("name", list(CORPUS))
def test_each_step_names_what_the_oracle_names(played: dict[str, Played], name: str) -> None:
    run = played[name]
    wrong = []
    for answer in run.answers:
        ranks, stages, data = _named(run.summaries[answer.step])
        if ranks != answer.workers or stages != set(answer.stages) or data != answer.data:
            wrong.append(
                f"step {answer.step}: named {ranks} stages {sorted(stages)} data {data}; "
                f"oracle {answer.workers} stages {sorted(answer.stages)} data {answer.data}"
            )
    assert not wrong, f"{name}: " + "; ".join(wrong)


def expected_flags(answers: list[StepAnswer]) -> dict[int, set[tuple[str, ...]]]:
    """The flags after each step, from the oracle's answers through the Collector's
    hysteresis (its constants read from its Go sources)."""
    k = int(collector_default("FlagK"))
    window = int(collector_default("FlagWindow"))
    clear = int(collector_default("ClearSteps"))
    warmup = int(collector_constant("warmupSteps"))
    history: dict[tuple[str, ...], int] = defaultdict(int)
    flagged: set[tuple[str, ...]] = set()
    out: dict[int, set[tuple[str, ...]]] = {}
    for i, answer in enumerate(answers):
        named: set[tuple[str, ...]] = set()
        if i >= warmup:
            named = {("rank", str(w), cause) for w, cause in answer.workers.items()}
            named |= {("stage", str(s)) for s in answer.stages}
            if answer.data:
                named.add(("data",))
        for key in list(history):
            history[key] = (history[key] << 1) & ((1 << window) - 1)
        for key in named:
            history[key] |= 1
        for key, bits in history.items():
            if key in flagged:
                if not bits & ((1 << clear) - 1):
                    flagged.discard(key)
                    history[key] = 0  # a flag that clears forgets the namings before it
            elif bits & 1 and bin(bits).count("1") >= k:
                flagged.add(key)
        out[answer.step] = set(flagged)
    return out


def _flags(summary: StepSummary) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = {("rank", str(f.rank), f.cause) for f in summary.flags}
    for im in summary.imbalances:
        if im.cause == semconv.CAUSE_STAGE_IMBALANCE:
            out.add(("stage", str(im.stage)))
        elif im.cause == semconv.CAUSE_DATA_IMBALANCE:
            out.add(("data",))
    return out


@pytest.mark.parametrize("name", list(CORPUS))
def test_flags_follow_the_oracle_through_the_hysteresis(
    played: dict[str, Played], name: str
) -> None:
    run = played[name]
    expected = expected_flags(run.answers)
    wrong = []
    for answer in run.answers:
        summary = run.summaries[answer.step]
        got, want = _flags(summary), expected[answer.step]
        # A named link puts its rank's NIC among the suspects (the corpus' hosts are
        # node<w> with one NIC, eth0), and nothing else is suspected.
        links = {f"nic:node{key[1]}/eth0" for key in want if key[2:] == ("network",)}
        suspects = {s.key for s in summary.suspects}
        if got != want or suspects != links:
            wrong.append(
                f"step {answer.step}: flags {sorted(got)} suspects {sorted(suspects)}; "
                f"want {sorted(want)} suspects {sorted(links)}"
            )
    assert not wrong, f"{name}: " + "; ".join(wrong)


def test_the_corpus_names_every_kind_of_cause(played: dict[str, Played]) -> None:
    """The corpus is not a set of easy cases: across it the oracle names a rank for each
    cause, a stage, the data, and nothing at all, and flags come and go."""
    causes: set[str] = set()
    stages = data = quiet = False
    for run in played.values():
        for answer in run.answers:
            causes |= set(answer.workers.values())
            stages = stages or bool(answer.stages)
            data = data or answer.data
            quiet = quiet or not (answer.workers or answer.stages or answer.data)
    assert causes == {"compute", "data", "host_work", "network"}
    assert stages and data and quiet


def test_a_step_sent_rank_by_rank_over_seconds_gets_the_same_verdicts(
    played: dict[str, Played], otelcol_path: Path, tmp_path: Path
) -> None:
    """Each rank's spans of a step in a request of its own, stage 0's ranks first, spread
    over two seconds a step (the SDK's batch processor exports each rank on its own
    schedule): the 64-rank heavy-stage job gets every step analysed with all 64 ranks and
    the same verdicts as when each step arrives at once."""
    name = "heavy-stage-sequence-imbalance"
    run = played[name]
    steps = {a.step for a in run.answers[:4]}
    requests = [r for r in _requests(name, run.job, tmp_path, per_rank=True) if r.step in steps]
    spread = replay(otelcol_path, requests, tmp_path / "collector", spread_s=2.0)[name]
    for step in sorted(steps):
        once, apart = run.summaries[step], spread[step]
        assert apart.ranks == once.ranks == 64
        assert _named(apart) == _named(once), step
        assert apart.duration_s == pytest.approx(once.duration_s, rel=1e-9)
        assert apart.whatif_s == pytest.approx(once.whatif_s, rel=1e-9)


def test_skewtrace_import_report_answers_as_the_collector_does(
    played: dict[str, Played], otelcol_path: Path, tmp_path: Path
) -> None:
    """``skewtrace import job.csv --report``, as a user runs it on the what-if analysis' own
    files (the table and the metadata beside it, the time unit taken from the epoch
    timestamps), analyses every step as the Collector fed over OTLP did: the same step
    times, what-ifs and root causes."""
    name = "heavy-last-stage"
    run = played[name]
    write_csv(run.job, tmp_path / "job.csv")
    write_metadata(run.job, tmp_path / "job.json")
    result = subprocess.run(
        [sys.executable, "-m", "skewtrace.cli", "import", str(tmp_path / "job.csv"),
         "--job", name, "--report", str(tmp_path / "report.html"),
         "--keep-spans", str(tmp_path / "spans.jsonl"), "--otelcol", str(otelcol_path)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert (tmp_path / "report.html").stat().st_size > 0
    summaries = {}
    for span in read_file_export(tmp_path / "spans.jsonl"):
        if span.name == semconv.SPAN_STEP_SUMMARY:
            summary = parse_summary(span)
            if summary is not None:
                summaries[summary.step] = summary
    assert sorted(summaries) == sorted(run.summaries)
    for step, summary in summaries.items():
        live = run.summaries[step]
        assert _named(summary) == _named(live), step
        assert summary.duration_s == pytest.approx(live.duration_s, rel=1e-9)
        assert summary.whatif_s == pytest.approx(live.whatif_s, rel=1e-9)
