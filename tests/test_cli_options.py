"""The ``skewtrace pacer`` flags are derived from the config dataclasses, one place per parameter,
and the settings' names follow one scheme (``SKEWTRACE_PACER_*``, durations in ``_MILLIS``), with
the earlier names still working as deprecated aliases."""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from skewtrace import _options
from skewtrace._options import FieldError, HostPort
from skewtrace.cli import _PACER_OPTIONS, ConsoleOptions, build_pacer_config, build_parser
from skewtrace.controller.config import PacerConfig
from skewtrace.controller.policies import POLICIES
from skewtrace.controller.policies.pacing import PolicyParams
from skewtrace.rank.config import Settings, env_var

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Iterator[None]:
    """Deprecation warnings are once per process; each test starts from none."""
    _options._warned.clear()
    yield
    _options._warned.clear()


def _config(*argv: str, env: dict[str, str] | None = None) -> tuple[PacerConfig, str]:
    parser = build_parser()
    args = parser.parse_args(["pacer", *argv])
    return build_pacer_config(args.parser, args, env or {})


def test_every_config_field_is_a_flag_with_help() -> None:
    classes = (PacerConfig, *(spec.params_type for spec in POLICIES), ConsoleOptions)
    fields = {
        f.name for cls in classes for f in dataclasses.fields(cls) if f.name != "policy_params"
    }
    assert {flag.field for flag in _PACER_OPTIONS} == fields
    for flag in _PACER_OPTIONS:
        assert flag.setting.help, f"{flag.field} has no docstring"
    flags = [flag.flag for flag in _PACER_OPTIONS]
    old_flags = [old for flag in _PACER_OPTIONS for old in flag.deprecated_flags]
    assert len(set(flags + old_flags)) == len(flags) + len(old_flags)


def test_durations_are_milliseconds_everywhere() -> None:
    for flag in _PACER_OPTIONS:
        holds_seconds = flag.field.endswith("_s")
        assert flag.setting.option.seconds == holds_seconds, flag.field
        assert flag.flag.endswith("-millis") == holds_seconds, flag.flag
        assert flag.env.endswith("_MILLIS") == holds_seconds, flag.env
        assert flag.env.startswith("SKEWTRACE_PACER_")


def test_defaults_are_the_dataclass_defaults() -> None:
    config, log_level = _config()
    assert config == PacerConfig()
    assert log_level == "info"


def test_flags_and_variables_reach_the_fields_in_milliseconds() -> None:
    config, log_level = _config(
        "--window-millis",
        "2500",
        "--max-delay-millis",
        "20",
        "--min-ranks",
        "3",
        "--http",
        "0.0.0.0:9000",
        env={
            "SKEWTRACE_PACER_MARGIN_MILLIS": "1.5",
            "SKEWTRACE_PACER_GAIN": "0.25",
            "SKEWTRACE_PACER_WINDOW_MILLIS": "9999",  # the flag wins
            "SKEWTRACE_PACER_LOG_LEVEL": "DEBUG",
        },
    )
    assert config.window_s == pytest.approx(2.5)
    assert config.http == HostPort("0.0.0.0", 9000)
    assert config.params_for(PolicyParams).max_delay_s == pytest.approx(0.020)
    assert config.params_for(PolicyParams).margin_s == pytest.approx(0.0015)
    assert config.params_for(PolicyParams).gain == 0.25
    assert config.params_for(PolicyParams).min_ranks == 3
    assert log_level == "debug"


def test_deprecated_names_take_seconds_and_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="skewtrace.config")
    env = {"SKEWTRACE_PACER_WINDOW_S": "3", "SKEWTRACE_PACER_MAX_DELAY": "0.01"}
    config, _ = _config("--margin-s", "0.004", env=env)
    assert config.window_s == pytest.approx(3.0)
    assert config.params_for(PolicyParams).max_delay_s == pytest.approx(0.01)
    assert config.params_for(PolicyParams).margin_s == pytest.approx(0.004)
    _config(env=env)  # a second read does not warn again
    messages = [r.getMessage() for r in caplog.records]
    assert sorted(messages) == [
        "--margin-s is deprecated; use --margin-millis (milliseconds; the old name took seconds)",
        "SKEWTRACE_PACER_MAX_DELAY is deprecated; use SKEWTRACE_PACER_MAX_DELAY_MILLIS "
        "(milliseconds; the old name took seconds)",
        "SKEWTRACE_PACER_WINDOW_S is deprecated; use SKEWTRACE_PACER_WINDOW_MILLIS "
        "(milliseconds; the old name took seconds)",
    ]


def test_the_new_name_wins_over_the_old(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="skewtrace.config")
    config, _ = _config(
        "--window-s",
        "9",
        "--window-millis",
        "1000",
        env={"SKEWTRACE_PACER_JOB_TIMEOUT_S": "1", "SKEWTRACE_PACER_JOB_TIMEOUT_MILLIS": "7000"},
    )
    assert config.window_s == pytest.approx(1.0)
    assert config.job_timeout_s == pytest.approx(7.0)
    assert "--window-s is deprecated and ignored: --window-millis is set" in caplog.text
    assert (
        "SKEWTRACE_PACER_JOB_TIMEOUT_S is deprecated and ignored: "
        "SKEWTRACE_PACER_JOB_TIMEOUT_MILLIS is set" in caplog.text
    )


def test_dataclass_errors_name_the_field() -> None:
    with pytest.raises(FieldError, match=r"^window_s must be a positive number$"):
        PacerConfig(window_s=0.0)
    with pytest.raises(FieldError, match=r"otlp_grpc port must be in 0\.\.65535"):
        PacerConfig(otlp_grpc=HostPort("127.0.0.1", 70000))
    with pytest.raises(FieldError, match="deactivate_threshold must be lower than activate"):
        PolicyParams(activate_threshold=0.01)


def test_pacer_help_lists_every_flag_with_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["pacer", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in _PACER_OPTIONS:
        assert flag.flag in text
        assert flag.env in text
    assert "--window-s " not in text  # deprecated names work but are not advertised
    # Field references in the docstrings read as flags.
    assert "for --activate-hold-millis (default 0.1)" in text


def _docs_table(path: Path, first_column: str) -> dict[str, str]:
    """{first cell: second cell} of the markdown table whose header starts with first_column."""
    rows: dict[str, str] = {}
    in_table = False
    for line in path.read_text().splitlines():
        if line.startswith(f"| {first_column} |"):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            break
        if in_table and not line.startswith("|---"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows[cells[0]] = cells[1]
    return rows


def test_docs_list_every_pacer_flag_with_its_default() -> None:
    table = _docs_table(REPO_ROOT / "docs" / "pacing.md", "flag")
    documented = {flag.strip("`"): default.strip("`") for flag, default in table.items()}
    expected = {flag.flag: flag.setting.show(flag.setting.default) for flag in _PACER_OPTIONS}
    assert documented == expected


def test_docs_list_every_rank_variable() -> None:
    table = _docs_table(REPO_ROOT / "docs" / "configuration.md", "variable")
    documented = {name.strip("`") for cell in table for name in cell.split(", ")}
    for field in dataclasses.fields(Settings):
        assert env_var(field.name) in documented, field.name
    assert "SKEWTRACE_PACING_MAX_DELAY" not in documented


def test_rank_and_pacer_variables_do_not_collide() -> None:
    """Both live in SKEWTRACE_PACER_*: only the token is shared, on purpose (the ranks send the
    token the pacer requires); the Collector's SKEWTRACE_PACER_OTLP_ENDPOINT is neither."""
    pacer = {flag.env for flag in _PACER_OPTIONS}
    pacer |= {old for flag in _PACER_OPTIONS for old in flag.deprecated_envs}
    rank = {env_var(f.name) for f in dataclasses.fields(Settings)}
    assert pacer & rank == {"SKEWTRACE_PACER_TOKEN"}
    assert "SKEWTRACE_PACER_OTLP_ENDPOINT" not in pacer | rank
    pacing = {name for name in rank if "PAC" in name}
    assert all(name.startswith("SKEWTRACE_PACER_") for name in pacing), pacing


_HEAVY = (
    "rich",
    "prometheus_client",
    "skewtrace.cluster.demo",
    "skewtrace.cluster.fabric",
    "skewtrace.cluster.job",
    "skewtrace.cluster.live",
    "skewtrace.cluster.metrics",
)


@pytest.mark.parametrize(
    "code",
    [
        "import skewtrace; skewtrace.instrument",
        "from skewtrace import cli\ntry:\n    cli.main(['pacer', '--help'])\nexcept SystemExit:\n"
        "    pass",
        "from skewtrace import cli\ntry:\n    cli.main(['timeline', 'first-change', '--help'])\n"
        "except SystemExit:\n    pass",
    ],
    ids=["rank", "pacer-help", "timeline-help"],
)
def test_a_rank_and_the_other_commands_load_no_demo_code(code: str) -> None:
    """Issue 24: the demo's needs (rich, prometheus-client, the fabric emulator) are the
    `demo` extra, imported only when `skewtrace demo` runs."""
    probe = (
        f"{code}\nimport sys\nprint(sorted(m for m in sys.modules for h in {_HEAVY!r} "
        "if m == h or m.startswith(h + '.')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout[-2000:]


def test_the_demo_and_timeline_needs_are_extras() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~ ;\[]", dep, maxsplit=1)[0] for dep in project["dependencies"]}
    assert not names & {"rich", "prometheus-client"}, names
    assert any(d.startswith("rich") for d in project["optional-dependencies"]["demo"])
    assert not [d for d in project["dependencies"] if "opentelemetry" in d and "<" in d]
