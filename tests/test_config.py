"""Settings from SKEWTRACE_* variables and the job id resolution order."""

from __future__ import annotations

import pytest

from skewtrace.rank.config import ConfigError, Settings, resolve_job_id


def test_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.enabled
    assert settings.buffer_events == 65536
    assert settings.export_interval_millis == 500
    assert settings.shutdown_timeout_millis == 5000
    assert settings.pacer_url is None
    assert settings.pacer_rank_max_delay_s == pytest.approx(0.05)


def test_env_values_are_parsed() -> None:
    settings = Settings.from_env(
        {
            "SKEWTRACE_BUFFER_EVENTS": "128",
            "SKEWTRACE_EXPORT_INTERVAL_MILLIS": "50",
            "SKEWTRACE_SHUTDOWN_TIMEOUT_MILLIS": "0",
            "SKEWTRACE_PACER_URL": "http://127.0.0.1:4320",
            "SKEWTRACE_PACING_MAX_DELAY": "0.01",
            "SKEWTRACE_PACER_TOKEN": "secret",
            "SKEWTRACE_JOB_ID": "job-1",
        }
    )
    assert (settings.buffer_events, settings.export_interval_millis) == (128, 50)
    assert settings.shutdown_timeout_millis == 0
    assert settings.pacer_url == "http://127.0.0.1:4320"
    assert settings.pacer_rank_max_delay_s == pytest.approx(0.01)
    assert settings.job_id == "job-1"
    assert "secret" not in repr(settings)


def test_arguments_override_env() -> None:
    settings = Settings.from_env({"SKEWTRACE_BUFFER_EVENTS": "128"}, buffer_events=7, job_id=None)
    assert settings.buffer_events == 7


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"SKEWTRACE_BUFFER_EVENTS": "lots"}, "SKEWTRACE_BUFFER_EVENTS"),
        ({"SKEWTRACE_BUFFER_EVENTS": "0"}, "SKEWTRACE_BUFFER_EVENTS"),
        ({"SKEWTRACE_EXPORT_INTERVAL_MILLIS": "-1"}, "SKEWTRACE_EXPORT_INTERVAL_MILLIS"),
        ({"SKEWTRACE_PACING_MAX_DELAY": "x"}, "SKEWTRACE_PACING_MAX_DELAY"),
        ({"SKEWTRACE_ENABLED": "maybe"}, "SKEWTRACE_ENABLED"),
        ({"SKEWTRACE_PACER_URL": "127.0.0.1:4320"}, "SKEWTRACE_PACER_URL"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        Settings.from_env(env)


def test_disabled_by_either_switch() -> None:
    assert not Settings.from_env({"SKEWTRACE_ENABLED": "false"}).enabled
    assert not Settings.from_env({"OTEL_SDK_DISABLED": "true"}).enabled


def test_unknown_override_is_rejected() -> None:
    with pytest.raises(TypeError, match="bufer"):
        Settings.from_env({}, bufer=3)


def test_job_id_order() -> None:
    env = {"SKEWTRACE_JOB_ID": "a", "TORCHELASTIC_RUN_ID": "b", "SLURM_JOB_ID": "c"}
    assert resolve_job_id("arg", 4, env) == "arg"
    assert resolve_job_id(None, 4, env) == "a"
    assert resolve_job_id(None, 4, {"TORCHELASTIC_RUN_ID": "b", "SLURM_JOB_ID": "c"}) == "b"
    assert resolve_job_id(None, 4, {"SLURM_JOB_ID": "c"}) == "c"


def test_torchrun_default_run_id_is_not_a_job_id() -> None:
    """torchrun without --rdzv-id sets TORCHELASTIC_RUN_ID=none for every job."""
    assert resolve_job_id(None, 4, {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "7"}) == "7"
    with pytest.raises(ConfigError):
        resolve_job_id(None, 2, {"TORCHELASTIC_RUN_ID": "none"})


def test_missing_job_id_with_several_ranks_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"SKEWTRACE_JOB_ID.*ranks"):
        resolve_job_id(None, 2, {})


def test_single_rank_gets_a_generated_job_id() -> None:
    first, second = resolve_job_id(None, 1, {}), resolve_job_id(None, 1, {})
    assert first.startswith("local-") and first != second
