"""Re-records the what-if corpus jobs that the Go tests of the diagnosis read.

    python tests/whatif/record.py                 # the jobs in RECORDED
    python tests/whatif/record.py slow-link ...   # some corpus jobs

For each job it writes, under ``tests/data/recorded/whatif/``:

- ``<job>.jsonl.gz``: the spans ``skewtrace import`` makes of the generated job (its CSV and
  metadata), as the requests a Collector receives (gzipped OTLP/JSON lines, one request a
  line, step by step: ``tests/span_replay.py``);
- ``<job>.oracle.json``: the oracle's answer for each step (its actual and ideal step, the
  workers, stages and data it names) and the generator's version.

``src/collector/internal/diagnosis/recorded_test.go`` plays each recording through the join
engine and the step analysis, with no Collector binary and no Python, and compares every
step with the oracle's answer: a change of a diagnosis rule fails ``go test`` in seconds.
``tests/test_whatif_corpus.py`` plays the whole corpus, generated afresh, through the built
Collector. Run this after changing the generator, the importer or the oracle.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from skewtrace.importer.whatif import read_whatif  # noqa: E402
from span_replay import requests_of_job, write_recording  # noqa: E402
from whatif.corpus import CORPUS  # noqa: E402
from whatif.generate import GENERATOR_VERSION, generate, write_csv, write_metadata  # noqa: E402
from whatif.oracle import analyze  # noqa: E402

OUT = HERE.parent / "data" / "recorded" / "whatif"

RECORDED = (
    "healthy-1f1b",
    "slow-worker-stage0",
    "heavy-last-stage",
    "heavy-stage-sequence-imbalance",
    "slow-link",
    "slow-dataloader",
    "host-work",
)
"""Small jobs that between them name every kind of cause (about 1.5 MB in all)."""


def record(name: str, out: Path = OUT) -> None:
    job = generate(CORPUS[name])
    with tempfile.TemporaryDirectory() as tmp:
        table, meta = Path(tmp) / f"{name}.csv", Path(tmp) / f"{name}.json"
        write_csv(job, table)
        write_metadata(job, meta)
        imported = read_whatif([table], job_id=name, meta=meta, time_unit="us")
    write_recording(requests_of_job(imported), out / f"{name}.jsonl.gz")
    answers = analyze(job.rows, job.metadata)
    steps = [
        {
            "step": a.step,
            "actual": a.actual,
            "ideal": a.ideal,
            "slowdown": a.slowdown,
            "workers": {str(w): cause for w, cause in sorted(a.workers.items())},
            "stages": sorted(a.stages),
            "data": a.data,
        }
        for a in answers
    ]
    document = {"job": name, "generator_version": GENERATOR_VERSION, "steps": steps}
    (out / f"{name}.oracle.json").write_text(json.dumps(document, indent=1) + "\n")


def main(argv: list[str]) -> int:
    names = argv or list(RECORDED)
    unknown = [n for n in names if n not in CORPUS]
    if unknown:
        print(f"not corpus jobs: {', '.join(unknown)}", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names:
        record(name)
        size = (OUT / f"{name}.jsonl.gz").stat().st_size
        print(f"{name}: {size / 1e3:.0f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
