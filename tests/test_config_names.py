"""The rank's settings: read from SKEWTRACE_<FIELD>, pacing ones in the pacer's family
SKEWTRACE_PACER_*, and the earlier SKEWTRACE_PACING_MAX_DELAY (seconds) still honored."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from skewtrace import _options
from skewtrace.rank.config import ConfigError, Settings


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Iterator[None]:
    _options._warned.clear()
    yield
    _options._warned.clear()


def test_rank_max_delay_is_milliseconds() -> None:
    settings = Settings.from_env({"SKEWTRACE_PACER_RANK_MAX_DELAY_MILLIS": "12.5"})
    assert settings.pacer_rank_max_delay_s == pytest.approx(0.0125)
    assert Settings.from_env({}).pacer_rank_max_delay_s == pytest.approx(0.05)


def test_old_max_delay_variable_works_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="skewtrace.config")
    env = {"SKEWTRACE_PACING_MAX_DELAY": "0.02"}
    assert Settings.from_env(env).pacer_rank_max_delay_s == pytest.approx(0.02)
    assert Settings.from_env(env).pacer_rank_max_delay_s == pytest.approx(0.02)
    assert [r.getMessage() for r in caplog.records] == [
        "SKEWTRACE_PACING_MAX_DELAY is deprecated; use SKEWTRACE_PACER_RANK_MAX_DELAY_MILLIS "
        "(milliseconds; the old name took seconds)"
    ]


def test_new_variable_wins(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="skewtrace.config")
    settings = Settings.from_env(
        {"SKEWTRACE_PACING_MAX_DELAY": "0.02", "SKEWTRACE_PACER_RANK_MAX_DELAY_MILLIS": "5"}
    )
    assert settings.pacer_rank_max_delay_s == pytest.approx(0.005)
    assert "SKEWTRACE_PACING_MAX_DELAY is deprecated and ignored" in caplog.text


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"SKEWTRACE_PACER_RANK_MAX_DELAY_MILLIS": "-1"},
            "SKEWTRACE_PACER_RANK_MAX_DELAY_MILLIS='-1': must be a number >= 0",
        ),
        (
            {"SKEWTRACE_PACER_POLL_INTERVAL_MILLIS": "0"},
            "SKEWTRACE_PACER_POLL_INTERVAL_MILLIS='0': must be an integer >= 1",
        ),
        ({"SKEWTRACE_PACER_URL": "localhost"}, "SKEWTRACE_PACER_URL='localhost': expected http"),
    ],
)
def test_errors_name_the_variable_and_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env(env)
    assert str(raised.value).startswith(message)


def test_argument_errors_name_the_argument_and_its_variable() -> None:
    with pytest.raises(ConfigError, match=r"^buffer_events \(SKEWTRACE_BUFFER_EVENTS\) must be"):
        Settings.from_env({"SKEWTRACE_BUFFER_EVENTS": "8"}, buffer_events=0)


def test_blank_is_unset() -> None:
    """As in the OpenTelemetry SDK: a variable set to nothing is not set."""
    settings = Settings.from_env({"SKEWTRACE_ENABLED": "", "SKEWTRACE_BUFFER_EVENTS": " "})
    assert settings == Settings()
