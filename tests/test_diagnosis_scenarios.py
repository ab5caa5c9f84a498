"""The diagnosis table: every scenario of scenario_gen through the real otelcol-skewtrace.

Each scenario (a parallel layout, faults, host clocks off by up to 2 s, every rank's spans
in batches of 1-3 steps, interleaved and out of order) is a job of its own; all run at once
through one collector with the distribution's own config. The verdicts are read back from
the collector's train.step.summary spans. Per scenario:

- healthy runs: nothing is flagged and nothing is suspected, in any step;
- faults: from a few steps after the onset to the end, exactly the expected ranks are
  flagged with the expected cause, and the expected parts of the fabric are suspected;
  never, in any step, is a rank outside the expected ones flagged;
- a fault that ends: its flags clear within a few steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from collector_harness import FILE_EXPORT_YAML, OTELCOL_YAML, CollectorProcess
from scenario_gen import SCENARIOS
from scenario_run import Outcome, run_scenarios
from span_replay import collector_default

pytestmark = [pytest.mark.slow, pytest.mark.collector]

# Steps after the onset by which the verdict must hold: flag_k root-cause steps, plus the
# steps a rank's batch may lag (read from the Collector's Go config, never copied).
SETTLE_STEPS = int(collector_default("FlagK")) + 2
# Steps after the end of a fault by which its flags must have cleared: clear_steps, plus two.
CLEAR_STEPS = int(collector_default("ClearSteps")) + 2


@pytest.fixture(scope="module")
def outcomes(otelcol_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    workdir = tmp_path_factory.mktemp("scenarios")
    with CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], workdir) as col:
        return run_scenarios(col, SCENARIOS.values())


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_verdict(name: str, outcomes: dict[str, Outcome]) -> None:
    outcome = outcomes[name]
    scenario = outcome.scenario
    exp = scenario.expected
    allowed = set(exp.flagged) | (exp.allowed or set())
    for step, v in sorted(outcome.steps.items()):
        wrong = set(v.flagged) - allowed
        assert not wrong, f"step {step}: ranks {sorted(wrong)} flagged, expected {exp.flagged}"
        if not scenario.faults:
            assert not v.suspects, f"healthy run, step {step}: suspects {v.suspects}"
    onset = scenario.onset()
    if onset is None or exp.allowed is not None:
        return
    end = scenario.fault_end() or scenario.steps
    for step in range(onset + SETTLE_STEPS, end):
        v = outcome.steps[step]
        assert v.flagged == exp.flagged, f"step {step}: flagged {v.flagged}, want {exp.flagged}"
        assert v.suspects == exp.suspects, (
            f"step {step}: suspects {sorted(v.suspects)}, want {sorted(exp.suspects)}"
        )
    if scenario.fault_end() is not None:
        clear = outcome.clear_step()
        assert clear is not None and clear - end <= CLEAR_STEPS, (
            f"fault ended at step {end}, flags cleared at step {clear}"
        )


def test_costs_are_what_the_fault_adds(outcomes: dict[str, Outcome]) -> None:
    """What-if: a rank whose data loading takes 30 ms longer costs each step about 30 ms."""
    last = outcomes["data-2d"].last()
    assert 0.020 <= last.costs[5] <= 0.040, last.costs
    assert last.slowdown > 1.1, last.slowdown
