"""The framework matrix's straggler runs, recorded for `tests/test_recorded_verdicts.py`
(``python tests/record_live.py frameworks``; see that script)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from _framework_matrix import ALL_PHASES, Case, job_spans, run
from collector_harness import FILE_EXPORT_YAML, OTELCOL_YAML, CollectorProcess
from expected_verdicts import record_job
from span_replay import recording_of_file_export

_SLOW_RANK_2 = {"flags": {"2": "compute"}}
# name -> (case, mode, what it injects as the Collector should conclude it). One mode per
# script, alternating, so both instrumentation paths are recorded.
RECORDED_CASES: dict[str, tuple[Case, str, dict[str, Any]]] = {
    "fsdp2": (Case("fsdp2"), "one-call", _SLOW_RANK_2),
    "tensor_parallel": (Case("tensor_parallel"), "zero-code", _SLOW_RANK_2),
    "fsdp2_tp": (Case("fsdp2_tp"), "zero-code", _SLOW_RANK_2),
    "pipelining": (
        Case("pipelining", forwards_per_step=4, point_to_point=True),
        "one-call",
        _SLOW_RANK_2,
    ),
    # The last of four stages 80 ms longer from the first step: a stage imbalance, no rank.
    "pipelining_stage": (
        Case(
            "pipelining",
            slow_rank=3,
            slow_from=0,
            slow_ms=80,
            forwards_per_step=4,
            point_to_point=True,
            steps=16,
        ),
        "zero-code",
        {"imbalances": ["stage_imbalance stage 3 ranks 3"]},
    ),
    "lightning": (Case("lightning_ddp", phases=ALL_PHASES), "zero-code", _SLOW_RANK_2),
    "accelerate": (Case("accelerate_gpt2", phases=ALL_PHASES), "one-call", _SLOW_RANK_2),
    "transformers": (Case("hf_trainer", phases=ALL_PHASES), "zero-code", _SLOW_RANK_2),
    "lightning_2ranks": (
        Case("lightning_ddp", ranks=2, slow_rank=1, slow_ms=60, phases=ALL_PHASES),
        "zero-code",
        {"flags": {"1": "compute"}},
    ),
}


def record_frameworks(otelcol: Path, only: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="skt-record-") as tmp:
        work = Path(tmp)
        with CollectorProcess(otelcol, [OTELCOL_YAML, FILE_EXPORT_YAML], work) as collector:
            for name, (case, mode, injected) in RECORDED_CASES.items():
                if only and name not in only:
                    continue
                job = f"fw-{name}-{mode}-{os.getpid()}"
                counts = work / name
                counts.mkdir()
                run(collector, case, mode, job, counts)
                job_spans(collector, job, case.steps - 2)
                requests = recording_of_file_export(collector.file_export_path, job)
                record_job("frameworks", name, requests, {
                    "job_id": job,
                    "made_by": f"examples/frameworks/{case.script}.py {' '.join(case.args)}"
                    f" under torchrun, {case.ranks} gloo ranks, {mode}; rank {case.slow_rank}"
                    f" {case.slow_ms} ms slower in its forward from step {case.slow_from}",
                    "steps": case.steps,
                    "ranks": case.ranks,
                    "injected": injected,
                })  # fmt: skip
                print(f"recorded {name}: {len(requests)} requests", flush=True)
