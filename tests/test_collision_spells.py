"""``benchmarks/collision.py``'s reading of a guarded run: which steps ran under the
schedule and which in the effect guard's spells without it, and what the guard judged, from
a decision trace and the ranks' ``step_stats`` as the benchmark writes them (synthetic files
with known answers; the benchmark itself runs in ``test_benchmark_smoke.py``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import collision


def body(t: float, job: str, spell: str, composed: bool = False, **effect: object) -> dict:
    state = effect.pop("state", "measuring")
    found = {"state": state, "gain": 0.0, "low": None, "high": None, "pairs": 0, **effect}
    out: dict = {
        "t": t,
        "job": f"job-{job}-interleave1",
        "job_name": job,
        "policy": "interleave",
        "active": spell == "scheduled",
    }
    if spell == "scheduled":
        out["schedule"] = {"period_s": 0.15, "slots": {}, "late_s": 0.015}
    if spell == "withheld":
        out["reason"] = "measuring"
    if spell == "free":  # no schedule asked for: the jobs in their turns
        out["reason"] = "no_collision"
    if composed:
        out["policy"] = "pacing,interleave"
        out["effect"] = {"state": "kept", "gain": 0.5, "low": 0.4, "high": 0.6, "pairs": 3}
        out["interleave.effect"] = found
    else:
        out["effect"] = found
    return out


@pytest.mark.parametrize("composed", [False, True], ids=["interleave", "both"])
def test_steps_are_split_by_the_decision_in_force(tmp_path: Path, composed: bool) -> None:
    trace = tmp_path / "decisions.jsonl"
    lines = []
    for t in range(100, 161):
        spell = "withheld" if 120 <= t < 130 else "free" if 150 <= t < 155 else "scheduled"
        extra = {"state": "kept", "gain": 0.12, "low": 0.08, "high": 0.16, "pairs": 3}
        for job in ("A", "B"):
            lines.append(body(t, job, spell, composed, **(extra if t >= 140 else {})))
    trace.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    # One step a second ending at .5: 150 ms under the schedule, 180 ms without it, 160 ms
    # in their turns with nothing asked for.
    ends = [t + 0.5 for t in range(100, 160)]
    took = [0.18 if 120 <= t < 130 else 0.16 if 150 <= t < 155 else 0.15 for t in range(100, 160)]
    rank = {"step_time_mean_s": 0.155, "step_times_s": took, "step_ends_unix": ends}
    faster = {**rank, "step_time_mean_s": 0.1}
    (tmp_path / "steps-x-1.json").write_text(json.dumps({"A": [faster, rank], "B": [rank]}))

    spells = collision.guard_spells(tmp_path, "x-1", trace)

    assert spells["steps"] == {"scheduled": 90, "withheld": 20, "free": 10}
    assert spells["scheduled_ms"] == pytest.approx(150.0)
    assert spells["free_ms"] == pytest.approx(160.0)
    assert spells["withheld_ms"] == pytest.approx(180.0)
    assert spells["gain"] == pytest.approx(0.2)
    # The interleave guard's judgement, once per job (not pacing's in the composition).
    assert [(j["job"], j["state"], j["gain"]) for j in spells["judged"]] == [
        ("A", "kept", 0.12),
        ("B", "kept", 0.12),
    ]


def test_a_run_without_the_guard_has_no_spells(tmp_path: Path) -> None:
    trace = tmp_path / "decisions.jsonl"
    lines = [body(t, "A", "scheduled") for t in range(100, 110)]
    for line in lines:  # a trace written before the benchmark added its own name
        del line["effect"], line["job_name"]
    trace.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    rank = {"step_time_mean_s": 0.15, "step_times_s": [0.15] * 5, "step_ends_unix": [101.0] * 5}
    (tmp_path / "steps-x-1.json").write_text(json.dumps({"A": [rank]}))
    spells = collision.guard_spells(tmp_path, "x-1", trace)
    assert spells["gain"] is None and spells["judged"] == []
    assert spells["steps"] == {"scheduled": 5, "withheld": 0, "free": 0}
