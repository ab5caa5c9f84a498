"""What the report and the live view say each straggler cause means."""

from __future__ import annotations

from skewtrace import semconv
from skewtrace.report.causes import meaning


def test_every_registered_cause_has_words() -> None:
    causes = [v for k, v in vars(semconv).items() if k.startswith("CAUSE_")]
    assert semconv.CAUSE_HOST_WORK in causes
    for cause in causes:
        assert meaning(cause) != cause, cause


def test_host_work_says_where_the_time_sat_and_that_it_is_outside_every_phase() -> None:
    text = meaning(semconv.CAUSE_HOST_WORK, semconv.SPAN_FORWARD)
    assert "outside every traced phase" in text
    assert text.endswith("before its forward")
    assert meaning(semconv.CAUSE_COMPUTE, semconv.SPAN_FORWARD) == meaning(semconv.CAUSE_COMPUTE)
