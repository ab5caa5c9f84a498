"""Verdicts on recorded spans, exactly: every recorded live job played through the built
Collector concludes, step by step, what its expectations say.

The recordings are the rank spans live runs sent (``tests/record_live.py`` made them and
remakes them): the main job's fault scenarios on the emulated fabric (``skewtrace demo
--scenario S``, six ranks of ``examples/train_2d.py``) and the framework matrix's straggler
runs (unmodified scripts under torchrun, rank 2 slower from step 10). Played again through a
fresh ``otelcol-skewtrace`` (``tests/span_replay.py``: requests one at a time, a step analysed
once its world ended it, the Collector stopped and drained; no clock decides anything), each
must give:

- a summary for every step, each with the job's whole world;
- per step, exactly the flags (rank and cause), fabric suspects and imbalances (cause, stage,
  ranks) of ``expected.json`` (``tests/expected_verdicts.py`` writes it; a change to a rule
  that moves any of them fails here and in the Go tests of the same files,
  ``TestRecordedVerdicts``);
- and, whatever the expectations say, nothing but what was injected: only the injected ranks
  are ever flagged, each only for its injected cause, only the injected fabric elements are
  suspected, and each injected fault is named for at least one step (``jobs.json``). So an
  expectation file cannot enshrine a false flag or a missed fault.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from expected_verdicts import KINDS, expected, jobs, per_step, replay_job, verdict

pytestmark = [pytest.mark.collector]

CASES = [(kind, name) for kind in KINDS for name in sorted(jobs(kind))]


@pytest.mark.parametrize(("kind", "name"), CASES, ids=[f"{k}/{n}" for k, n in CASES])
def test_recorded_job_concludes_exactly_its_expectations(
    kind: str, name: str, otelcol_path: Path, tmp_path: Path
) -> None:
    job: dict[str, Any] = jobs(kind)[name]
    want = expected(kind).get(name)
    assert want is not None, f"no expectations for {kind}/{name}: run tests/expected_verdicts.py"
    summaries = replay_job(otelcol_path, kind, name, tmp_path)
    # Every step the job ran (a trainer may run one more than it was asked for).
    assert sorted(summaries) == list(range(want["steps"])), sorted(summaries)
    assert want["steps"] >= job["steps"]
    assert {s.ranks for s in summaries.values()} == {job["ranks"]}

    got = {step: verdict(summary) for step, summary in summaries.items()}
    wrong = {step: got[step] for step, v in per_step(want["segments"]).items() if got[step] != v}
    assert not wrong, f"steps whose verdict differs from expected.json: {wrong}"

    injected = job["injected"]
    allowed_flags: dict[str, str] = injected.get("flags", {})
    allowed_suspects = set(injected.get("suspects", []))
    allowed_imbalances = set(injected.get("imbalances", []))
    flagged, suspected, imbalanced = set(), set(), set()
    for step, v in sorted(got.items()):
        stray = {r: c for r, c in v["flags"].items() if allowed_flags.get(r) != c}
        assert not stray, f"step {step}: flagged {stray}, not injected ({injected})"
        assert set(v["suspects"]) <= allowed_suspects, (step, v["suspects"], injected)
        assert set(v["imbalances"]) <= allowed_imbalances, (step, v["imbalances"], injected)
        flagged |= set(v["flags"])
        suspected |= set(v["suspects"])
        imbalanced |= set(v["imbalances"])
    assert flagged == set(allowed_flags), (flagged, injected)
    assert suspected == allowed_suspects, (suspected, injected)
    assert imbalanced == allowed_imbalances, (imbalanced, injected)
