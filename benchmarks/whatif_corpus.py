"""The what-if corpus through the built Collector against the reference replay: the table of
docs/evaluation.md ("The right cause and the right price"), and jobs past 256 ranks.

    python benchmarks/whatif_corpus.py                      # the corpus (tests/whatif/corpus.py)
    python benchmarks/whatif_corpus.py --large              # and 1024- and 4096-rank jobs
    python benchmarks/whatif_corpus.py --jobs slow-link,host-work
    python benchmarks/whatif_corpus.py --smoke              # one small job

Each job is generated (tests/whatif/generate.py, deterministic seeds), written as the what-if
analysis' own CSV, read by ``skewtrace import``'s reader and played through a fresh
``otelcol-skewtrace`` (tests/span_replay.py); the reference replay (tests/whatif/oracle.py,
written apart from the Collector) answers each step from the same rows. Per job it prints:
what the oracle names, its slowdown over the steps, the Collector's, the worst distance
between the two as a share of the tolerance (|S - S_oracle| <= 0.1 x (S_oracle - 1) + 0.02:
target <= 1), and in how many steps the Collector named exactly what the oracle named
(target: all). Exit status 1 when a target is missed (the last line says so).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from _smoke import SMOKE_HELP  # noqa: E402
from skewtrace import semconv  # noqa: E402
from skewtrace.importer.whatif import read_whatif  # noqa: E402
from skewtrace.report.model import StepSummary  # noqa: E402
from span_replay import replay, requests_of_job  # noqa: E402
from whatif.corpus import CORPUS  # noqa: E402
from whatif.generate import (  # noqa: E402
    GENERATOR_VERSION,
    JobSpec,
    SlowWorker,
    generate,
    write_csv,
    write_metadata,
)
from whatif.oracle import StepAnswer, analyze  # noqa: E402

SMOKE_JOB = "slow-dataloader"
"""``--smoke``: one small corpus job. Its targets hold at any size (the Collector against the
oracle on the same rows), so they are judged."""
LARGE = (
    # Past the make-test corpus: the same comparison at 1024 and 4096 ranks (workers).
    JobSpec(
        "large-1024-slow-worker",
        dp=128,
        pp=8,
        microbatches=8,
        steps=4,
        seed=41,
        causes=(SlowWorker(stage=5, dp_rank=77, factor=1.5),),
    ),
    JobSpec(
        "large-4096-slow-worker",
        dp=1024,
        pp=4,
        microbatches=4,
        steps=3,
        seed=42,
        causes=(SlowWorker(stage=2, dp_rank=700, factor=1.5),),
    ),
)


def _named(answer: StepAnswer) -> str:
    parts = [f"rank {w} {cause}" for w, cause in sorted(answer.workers.items())]
    parts += [f"stage {s}" for s in sorted(answer.stages)]
    if answer.data:
        parts.append("data")
    return ", ".join(parts) or "nothing"


def _collector_named(summary: StepSummary) -> str:
    roots = sorted(summary.root_causes, key=lambda r: r.rank)
    parts = [f"rank {rc.rank} {rc.cause}" for rc in roots]
    parts += [
        f"stage {im.stage}"
        for im in sorted(summary.imbalance_causes, key=lambda i: i.stage or 0)
        if im.cause == semconv.CAUSE_STAGE_IMBALANCE
    ]
    if any(im.cause == semconv.CAUSE_DATA_IMBALANCE for im in summary.imbalance_causes):
        parts.append("data")
    return ", ".join(parts) or "nothing"


def _causes(spec: JobSpec) -> str:
    if not spec.causes:
        return "none"
    out = []
    for cause in spec.causes:
        if hasattr(cause, "describe"):
            out.append(cause.describe())
            continue
        fields = {k: v for k, v in vars(cause).items() if k not in ("first_step", "last_step")}
        text = type(cause).__name__ + "(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")"
        if cause.first_step or cause.last_step is not None:
            last = "" if cause.last_step is None else cause.last_step
            text += f" steps {cause.first_step}-{last}"
        out.append(text)
    return " + ".join(out)


def _range(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}"


def run_job(spec: JobSpec, otelcol: Path, workdir: Path) -> tuple[list[str], bool]:
    started = time.monotonic()
    job = generate(spec)
    write_csv(job, workdir / f"{spec.name}.csv")
    write_metadata(job, workdir / f"{spec.name}.json")
    answers = analyze(job.rows, job.metadata)
    imported = read_whatif(
        [workdir / f"{spec.name}.csv"],
        job_id=spec.name,
        meta=workdir / f"{spec.name}.json",
        time_unit="us",
    )
    summaries = replay(otelcol, requests_of_job(imported), workdir / spec.name).get(spec.name, {})
    worst, agree, theirs, ours = 0.0, 0, [], []
    named = sorted({_named(a) for a in answers})
    for answer in answers:
        summary = summaries.get(answer.step)
        if summary is None:
            continue
        slowdown = summary.duration_s / summary.whatif_s
        tolerance = 0.1 * (answer.slowdown - 1) + 0.02
        worst = max(worst, abs(slowdown - answer.slowdown) / tolerance)
        theirs.append(answer.slowdown)
        ours.append(slowdown)
        agree += _collector_named(summary) == _named(answer)
    ok = len(ours) == len(answers) and worst <= 1 and agree == len(answers)
    workers = spec.dp * spec.pp
    row = [
        spec.name,
        f"{spec.pp}x{spec.dp} ({workers}), {spec.schedule}, {spec.p2p}, {spec.microbatches} mb",
        _causes(spec),
        "; ".join(named),
        _range(theirs) if theirs else "-",
        _range(ours) if ours else "-",
        f"{worst:.2f}",
        f"{agree}/{len(answers)}",
        f"{time.monotonic() - started:.0f} s",
    ]
    return row, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="", help="comma-separated corpus jobs (default: all)")
    parser.add_argument("--large", action="store_true", help="also the 1024- and 4096-rank jobs")
    parser.add_argument("--otelcol", default=str(REPO / "build" / "otelcol-skewtrace"))
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"{SMOKE_HELP}: the {SMOKE_JOB} job alone (its targets judged as in a full run)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.jobs, args.large = SMOKE_JOB, False
    names = [n for n in args.jobs.split(",") if n] or list(CORPUS)
    unknown = [n for n in names if n not in CORPUS]
    if unknown:
        print(f"not corpus jobs: {', '.join(unknown)}", file=sys.stderr)
        return 2
    specs = [CORPUS[n] for n in names] + (list(LARGE) if args.large else [])
    print(f"generator {GENERATOR_VERSION}; slowdown tolerance 0.1 x (oracle - 1) + 0.02")
    print(
        "| job | layout | causes | the oracle names | oracle slowdown | skewtrace's | "
        "worst / tolerance (target <= 1) | steps named alike (target: all) | time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in specs:
            row, ok = run_job(spec, Path(args.otelcol), Path(tmp))
            print("| " + " | ".join(row) + " |", flush=True)
            if not ok:
                failed.append(spec.name)
    print(f"SUMMARY: {len(specs) - len(failed)} of {len(specs)} jobs met both targets")
    if failed:
        print(f"FAIL: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
