"""The framework matrix (issue 22), the trainers: unmodified scripts under examples/frameworks/
for PyTorch Lightning (``Trainer(strategy="ddp")``), Accelerate (a tiny GPT-2 from a config,
``accelerator.prepare``/``accelerator.backward``), transformers.Trainer and DeepSpeed ZeRO
(stages 2 and 3), each run by torchrun on four gloo ranks against the built otelcol-skewtrace,
under zero-code (``opentelemetry-instrument``) and one call where the user can make it (the
trainers own the loop: a Lightning ``Callback``, a ``TrainerCallback``, or right after
``accelerator.prepare``/``deepspeed.initialize``).

The run and the checks are tests/_framework_matrix.py's, shared with tests/test_frameworks.py:
every collective the process groups ran (their own counters) has its span, every phase span
(``train.step``, ``forward``, ``backward``, ``optimizer.step``) on every rank for every step,
every collective joined complete, the step summaries out, and rank 2 flagged for ``compute``
at some point once it turns slow. Lightning under zero-code runs in ``make test``; the rest
under ``make eval``; the verdicts of every step are tested on the recorded runs
(tests/test_recorded_verdicts.py). Lightning and Accelerate also run on two ranks, rank 1 60 ms
slower per step, as many users start: two ranks have no peers' median to compare with, and
the slow rank must still be flagged.

The frameworks come from the ``frameworks`` extra (``pip install -e '.[frameworks]'``), which
CI installs (the Makefile's venv target); a case whose package is missing skips, naming it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _framework_matrix import ALL_PHASES, MODES, Case, collector_process, run_and_check
from collector_harness import CollectorProcess

pytestmark = [pytest.mark.collector, pytest.mark.slow]

# case -> (the case, the package it needs, the modes it runs in)
TRAINERS: dict[str, tuple[Case, str, tuple[str, ...]]] = {
    "lightning": (Case("lightning_ddp", phases=ALL_PHASES), "pytorch_lightning", MODES),
    "accelerate": (Case("accelerate_gpt2", phases=ALL_PHASES), "accelerate", MODES),
    "transformers": (Case("hf_trainer", phases=ALL_PHASES), "transformers", MODES),
    "deepspeed-zero2": (
        Case("deepspeed_zero", phases=ALL_PHASES, args=("--stage", "2")),
        "deepspeed",
        MODES,
    ),
    # Two ranks, one 60 ms slower per step: the peers' median is no reference there (issue
    # 21); zero-code only, to keep the matrix short.
    "lightning-2ranks": (
        Case("lightning_ddp", ranks=2, slow_rank=1, slow_ms=60, phases=ALL_PHASES),
        "pytorch_lightning",
        ("zero-code",),
    ),
    "accelerate-2ranks": (
        Case("accelerate_gpt2", ranks=2, slow_rank=1, slow_ms=60, phases=ALL_PHASES),
        "accelerate",
        ("zero-code",),
    ),
    # Per-layer parameter all-gathers, as FSDP's: zero-code only, to keep the matrix short.
    "deepspeed-zero3": (
        Case("deepspeed_zero", phases=ALL_PHASES, args=("--stage", "3")),
        "deepspeed",
        ("zero-code",),
    ),
}


@pytest.fixture(scope="module")
def collector(otelcol_path: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    yield from collector_process(otelcol_path, tmp_path_factory.mktemp("trainers"))


# One run in `make test` proves an untouched trainer's job flows; the rest of the matrix runs
# under `make eval`, and the verdicts, step by step, are tested on the recorded runs
# (tests/test_recorded_verdicts.py).
_IN_MAKE_TEST = {("lightning", "zero-code")}


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        pytest.param(name, mode, marks=() if (name, mode) in _IN_MAKE_TEST else pytest.mark.eval)
        for name, (_, _, modes) in TRAINERS.items()
        for mode in modes
    ],
)
def test_trainer_traced_joined_and_diagnosed(
    collector: CollectorProcess, tmp_path: Path, name: str, mode: str
) -> None:
    case, package, _ = TRAINERS[name]
    pytest.importorskip(package, reason=f"{package} is not installed (the frameworks extra)")
    run_and_check(collector, case, mode, tmp_path)
