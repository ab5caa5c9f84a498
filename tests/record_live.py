"""Re-record the live jobs whose verdicts `tests/test_recorded_verdicts.py` checks.

    python tests/record_live.py main-job [--only SCENARIO ...]   # needs root and iproute2
    python tests/record_live.py frameworks [--only CASE ...]
    python tests/expected_verdicts.py --update                     # then review the diff

Each job runs live once, exactly as its live test runs it (the main job's scenarios as
``skewtrace demo --scenario S --pacing off --steps 26`` on the emulated fabric; the framework
matrix's straggler runs under torchrun), against a Collector with the file export. The rank
spans the job sent (its summaries and the processor's annotations taken out:
:func:`span_replay.recording_of_file_export`) are written to
``tests/data/recorded/<kind>/<name>.jsonl.gz``, and what was injected where to
``tests/data/recorded/<kind>/jobs.json``. A recording is what one run on one machine sent:
re-recording replaces it, and its expectations must be made again and read.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from expected_verdicts import record_job
from span_replay import recording_of_file_export

REPO = Path(__file__).resolve().parents[1]

MAIN_JOB_STEPS = 26
# The main job's fault scenarios (`skewtrace demo --scenario`): a 26-step run, faults from
# step 8 (hetero: the whole run; compute:3 ends at 16).
# What each injects, as the Collector should conclude it: ranks flagged with their causes,
# fabric elements suspected.
MAIN_JOB_SCENARIOS: dict[str, dict[str, Any]] = {
    "nic:node2:200@8": {"flags": {"2": "network"}, "suspects": ["nic:node2/eth0"]},
    "uplink:leaf0:200@8": {"suspects": ["uplink:leaf0"]},
    "compute:4:0.05@8": {"flags": {"4": "compute"}},
    "data:1:0.05@8": {"flags": {"1": "data"}},
    "rack:leaf1:0.05@8": {"flags": {"2": "compute", "3": "compute"}, "suspects": ["switch:leaf1"]},
    "compute:3:0.05@8:16": {"flags": {"3": "compute"}},
    "hetero:node5:12": {"flags": {"5": "compute"}},
}


def slug(name: str) -> str:
    """A file name for a scenario or case."""
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


def record_main_job(otelcol: Path, only: list[str]) -> None:
    for scenario in only or MAIN_JOB_SCENARIOS:
        with tempfile.TemporaryDirectory(prefix="skt-record-") as tmp:
            work = Path(tmp)
            subprocess.run(
                [sys.executable, "-m", "skewtrace.cli", "demo", "--otelcol", str(otelcol),
                 "--workdir", str(work), "--quiet", "--scenario", scenario,
                 "--pacing", "off", "--steps", str(MAIN_JOB_STEPS)],
                check=True, timeout=600,
            )  # fmt: skip
            (run,) = json.loads((work / "summary.json").read_text())["runs"]
            requests = recording_of_file_export(work / "spans.jsonl", run["job_id"])
            record_job("main_job", slug(scenario), requests, {
                "job_id": run["job_id"],
                "made_by": f"skewtrace demo --scenario {scenario} --pacing off "
                f"--steps {MAIN_JOB_STEPS}",
                "scenario": scenario,
                "steps": MAIN_JOB_STEPS,
                "ranks": 6,
                "injected": MAIN_JOB_SCENARIOS[scenario],
                "phases": [
                    {"steps": p["steps"], "expected": p["expected"], "onset_step": p["onset_step"]}
                    for p in run["phases"]
                ],
            })  # fmt: skip
            print(f"recorded {scenario}: {len(requests)} requests", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("kind", choices=["main-job", "frameworks"])
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--otelcol", type=Path, default=REPO / "build" / "otelcol-skewtrace")
    args = parser.parse_args()
    if args.kind == "main-job":
        record_main_job(args.otelcol, args.only)
    else:
        from record_frameworks import record_frameworks

        record_frameworks(args.otelcol, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
