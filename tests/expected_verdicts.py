"""Exact expectations of the recorded jobs' verdicts, step by step, and the tool that writes
them.

    python tests/expected_verdicts.py [--update] [--only NAME ...]

A recorded job (``tests/data/recorded/<kind>/<name>.jsonl.gz``, listed in that folder's
``jobs.json``) has its expectations in ``tests/data/recorded/<kind>/expected.json``: the
verdict of every analysed step (the ranks flagged with their causes, the fabric suspects, the
imbalances by cause, stage and ranks), as segments of consecutive steps with the same verdict
(``{"steps": [first, last], "flags": {"2": "network"}, "suspects": [...], "imbalances":
[...]}``). ``tests/test_recorded_verdicts.py`` plays each recording through the built
Collector and the Go tests (``TestRecordedVerdicts``) through the analysis alone, and both
compare every step with these.

Without ``--update`` the tool prints, per job, where the Collector's verdicts now differ from
the file. ``--update`` writes what the Collector now concludes. Each update is a claim that
the new verdicts are right: read the diff against ``jobs.json``'s description of what was
injected where before committing it (``git diff tests/data/recorded``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from skewtrace.report.model import StepSummary
from span_replay import Request, read_recording, replay, write_recording

RECORDED = Path(__file__).parent / "data" / "recorded"
KINDS = ("main_job", "frameworks", "demo")
"""The folders of recorded jobs whose every step has an exact expectation."""

Verdict = dict[str, Any]


def verdict(summary: StepSummary) -> Verdict:
    """What a step concluded: flags (rank -> cause), suspects, imbalances."""
    return {
        "flags": {str(f.rank): f.cause for f in sorted(summary.flags, key=lambda f: f.rank)},
        "suspects": sorted(s.key for s in summary.suspects),
        "imbalances": sorted(
            f"{i.cause} stage {i.stage} ranks {i.ranks}"
            if i.stage is not None
            else f"{i.cause} ranks {i.ranks}"
            for i in summary.imbalances
        ),
    }


def segments(summaries: Mapping[int, StepSummary]) -> list[Verdict]:
    """Consecutive steps with the same verdict, as ``{"steps": [first, last], **verdict}``."""
    out: list[Verdict] = []
    for step in sorted(summaries):
        v = verdict(summaries[step])
        if out and out[-1]["steps"][1] == step - 1 and _same(out[-1], v):
            out[-1]["steps"][1] = step
        else:
            out.append({"steps": [step, step], **v})
    return out


def _same(segment: Verdict, v: Verdict) -> bool:
    return all(segment[k] == v[k] for k in v)


def per_step(expected: list[Verdict]) -> dict[int, Verdict]:
    """The segments back to one verdict per step."""
    out: dict[int, Verdict] = {}
    for segment in expected:
        first, last = segment["steps"]
        for step in range(first, last + 1):
            out[step] = {k: segment[k] for k in ("flags", "suspects", "imbalances")}
    return out


def _read(kind: str, file: str) -> dict[str, Any]:
    path = RECORDED / kind / file
    return dict(json.loads(path.read_text())) if path.exists() else {}


def _write(kind: str, file: str, data: dict[str, Any]) -> None:
    path = RECORDED / kind / file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def jobs(kind: str) -> dict[str, dict[str, Any]]:
    """The recorded jobs of a kind (``jobs.json``)."""
    return dict(_read(kind, "jobs.json").get("jobs", {}))


def expected(kind: str) -> dict[str, dict[str, Any]]:
    """The expectations of a kind's jobs (``expected.json``)."""
    return _read(kind, "expected.json")


def record_job(kind: str, name: str, requests: Sequence[Request], job: dict[str, Any]) -> None:
    """Writes a recording and its entry in its kind's ``jobs.json`` (the others kept)."""
    write_recording(requests, RECORDED / kind / f"{name}.jsonl.gz")
    manifest = _read(kind, "jobs.json")
    manifest.setdefault("jobs", {})[name] = job
    _write(kind, "jobs.json", manifest)


def replay_job(otelcol: Path, kind: str, name: str, workdir: Path) -> dict[int, StepSummary]:
    """The step summaries of a recorded job played through the built Collector."""
    requests = read_recording(RECORDED / kind / f"{name}.jsonl.gz")
    return replay(otelcol, requests, workdir).get(jobs(kind)[name]["job_id"], {})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--update", action="store_true")
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument(
        "--otelcol", type=Path, default=RECORDED.parents[2] / "build" / "otelcol-skewtrace"
    )
    args = parser.parse_args()
    differ = 0
    for kind in KINDS:
        current = expected(kind)
        for name in sorted(jobs(kind)):
            if args.only and name not in args.only:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                summaries = replay_job(args.otelcol, kind, name, Path(tmp))
            got = segments(summaries)
            if got != current.get(name, {}).get("segments"):
                differ += 1
                print(f"{kind}/{name}: differs", flush=True)
                for segment in got:
                    print(f"    {json.dumps(segment)}")
            current[name] = {"steps": len(summaries), "segments": got}
        if args.update and current:
            _write(kind, "expected.json", current)
    print(f"{differ} job(s) differ from their expectations" + (" (updated)" if args.update else ""))
    return 1 if differ and not args.update else 0


if __name__ == "__main__":
    sys.exit(main())
