"""The ``skewtrace`` console script.

Subcommands:

- ``skewtrace pacer``: run the pacing controller (see ``docs/pacing.md``).
- ``skewtrace demo``: the collector, the pacer and a 4-rank job with a straggler, end to end.
- ``skewtrace report``: the HTML report of a run from the Collector's span file
  (:mod:`skewtrace.report`).
- ``skewtrace advise``: the stage partition the Collector advises for a heavy pipeline
  stage, from the same file (:mod:`skewtrace.report.advise`).
- ``skewtrace timeline``: the first component to change before a slowdown, and before/after
  figures, read from Prometheus (:mod:`skewtrace.timeline`).
- ``skewtrace import``: recorded traces (a CSV table, what-if traces, or PyTorch profiler
  traces) sent as the instrumentation's spans to a Collector, or analysed locally into the
  HTML report (:mod:`skewtrace.importer`, ``docs/import.md``).

The ``pacer`` flags are the fields of :class:`~skewtrace.controller.config.PacerConfig` and
of every registered policy's parameters (:data:`skewtrace.controller.policies.POLICIES`, one
section of ``--help`` each), with the docstring under each field as its help
(see :mod:`skewtrace._options`): a field ``window_s`` holding seconds is ``--window-millis``,
given in milliseconds. Every flag can also come from ``SKEWTRACE_PACER_<FLAG>`` (upper case,
dashes as underscores: ``SKEWTRACE_PACER_WINDOW_MILLIS``); a flag on the command line wins.
The names before milliseconds (``--window-s``, ``SKEWTRACE_PACER_WINDOW_S``, ``--max-delay``,
in seconds) still work and log a warning. A value that cannot be used is an error naming the
flag (and the variable, when it came from one), exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from skewtrace._options import (
    FieldError,
    Given,
    HostPort,
    Setting,
    check_fields,
    from_env,
    integer,
    one_of,
    option,
    settings,
    warn_deprecated,
    word,
)
from skewtrace.controller.config import PacerConfig
from skewtrace.controller.policies import POLICIES, job_policies, policy_names
from skewtrace.report import advise as advise_command
from skewtrace.report import command as report_command
from skewtrace.timeline import command as timeline_command

ENV_PREFIX = "SKEWTRACE_PACER_"


@dataclass(frozen=True)
class ConsoleOptions:
    """What the console script needs beyond the service's configuration."""

    log_level: str = option("info", parse=word, check=one_of("debug", "info", "warning", "error"))
    """Logging threshold: debug, info, warning or error."""

    def __post_init__(self) -> None:
        check_fields(self)


# Each class's option fields, in the order --help lists them, under these headings: the
# service, every registered policy's parameters (in registry order), the console.
_SECTIONS: tuple[tuple[type, str], ...] = (
    (PacerConfig, "service"),
    *((spec.params_type, spec.title) for spec in POLICIES),
    (ConsoleOptions, "console"),
)


@dataclass(frozen=True)
class PacerFlag:
    """One ``skewtrace pacer`` flag: a config field with its flag and variable names."""

    section: type
    setting: Setting

    @property
    def field(self) -> str:
        return self.setting.field

    @property
    def flag(self) -> str:
        return "--" + self.setting.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.setting.name.upper()

    @property
    def deprecated_flags(self) -> tuple[str, ...]:
        return tuple("--" + old.replace("_", "-") for old in self.setting.option.deprecated)

    @property
    def deprecated_envs(self) -> tuple[str, ...]:
        return tuple(ENV_PREFIX + old.upper() for old in self.setting.option.deprecated)


_PACER_OPTIONS: tuple[PacerFlag, ...] = tuple(
    PacerFlag(cls, setting) for cls, _ in _SECTIONS for setting in settings(cls)
)
_BY_FIELD = {pacer_flag.field: pacer_flag for pacer_flag in _PACER_OPTIONS}


def _flag_of(field_name: str) -> str:
    found = _BY_FIELD.get(field_name)
    return found.flag if found else field_name


def _help(pacer_flag: PacerFlag) -> str:
    # ``other_field`` in a docstring becomes the flag users know it by.
    described = re.sub(
        r"``(\w+)``", lambda m: _flag_of(m[1]), pacer_flag.setting.help or pacer_flag.field
    ).rstrip(".")
    if pacer_flag.setting.option.parse == policy_names:
        known = ", ".join(f"{spec.name} ({spec.summary})" for spec in POLICIES)
        described = f"{described}: {known}"
    default = pacer_flag.setting.show(pacer_flag.setting.default)
    return f"{described} (default {default}) [env {pacer_flag.env}]".replace("%", "%%")


def _metavar(pacer_flag: PacerFlag) -> str:
    parse = pacer_flag.setting.option.parse
    if pacer_flag.setting.option.seconds:
        return "MILLIS"
    if parse == HostPort.parse:
        return "HOST:PORT"
    if parse == policy_names:
        return "NAME[,NAME]"
    if parse == job_policies:
        return "PATTERN=NAME[,NAME][;...]"
    return "N" if parse is integer else "VALUE"


def _old_dest(pacer_flag: PacerFlag, index: int) -> str:
    return f"deprecated {pacer_flag.field} {index}"


def _add_pacer(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "pacer",
        help="run the pacing controller",
        description="Receive the barrierskew metrics by OTLP/gRPC and serve per-rank pacing "
        "delays (and, with --policy rebalance, shares of the global batch) over HTTP. Every "
        f"flag can be set as {ENV_PREFIX}<FLAG> as well; durations are in milliseconds.",
    )
    groups = {cls: parser.add_argument_group(title) for cls, title in _SECTIONS}
    for pacer_flag in _PACER_OPTIONS:
        group = groups[pacer_flag.section]
        group.add_argument(
            pacer_flag.flag,
            dest=pacer_flag.field,
            default=None,
            metavar=_metavar(pacer_flag),
            help=_help(pacer_flag),
        )
        for index, old in enumerate(pacer_flag.deprecated_flags):
            group.add_argument(old, dest=_old_dest(pacer_flag, index), help=argparse.SUPPRESS)
    parser.set_defaults(run=_run_pacer, parser=parser)


def _given(pacer_flag: PacerFlag, args: argparse.Namespace, env: Mapping[str, str]) -> Given | None:
    """The text for one flag: the flag, else a deprecated flag, else the variable(s)."""
    raw = getattr(args, pacer_flag.field)
    old_flags = [
        (old, getattr(args, _old_dest(pacer_flag, i)))
        for i, old in enumerate(pacer_flag.deprecated_flags)
    ]
    if raw is not None:
        for old, old_raw in old_flags:
            if old_raw is not None:
                warn_deprecated(old, pacer_flag.flag, ignored=True)
        return Given(raw, pacer_flag.flag)
    for old, old_raw in old_flags:
        if old_raw is not None:
            warn_deprecated(old, pacer_flag.flag, pacer_flag.setting.unit_note)
            return Given(old_raw, old, deprecated=True)
    found = from_env(pacer_flag.setting, env, ENV_PREFIX)
    if found is None:
        return None
    return Given(found.raw, f"{pacer_flag.flag} (from {found.source})", found.deprecated)


def build_pacer_config(
    parser: argparse.ArgumentParser, args: argparse.Namespace, env: Mapping[str, str]
) -> tuple[PacerConfig, str]:
    """(PacerConfig, log level) from flags and environment; exits 2 naming the bad flag."""
    values: dict[type, dict[str, Any]] = {cls: {} for cls, _ in _SECTIONS}
    given: dict[str, Given] = {}
    for pacer_flag in _PACER_OPTIONS:
        found = _given(pacer_flag, args, env)
        if found is None:
            continue
        try:
            values[pacer_flag.section][pacer_flag.field] = pacer_flag.setting.value(
                found.raw, deprecated=found.deprecated
            )
        except ValueError as exc:
            parser.error(f"{found.source}={found.raw!r}: {exc}")
        given[pacer_flag.field] = found
    try:
        policy_params = tuple(spec.params_type(**values[spec.params_type]) for spec in POLICIES)
        config = PacerConfig(policy_params=policy_params, **values[PacerConfig])
        console = ConsoleOptions(**values[ConsoleOptions])
    except FieldError as exc:
        bad = given.get(exc.field)
        if bad is not None:
            where = f"{bad.source}={bad.raw!r}"
        else:
            setting = _BY_FIELD[exc.field].setting
            where = f"{_flag_of(exc.field)} (default {setting.show(setting.default)})"
        parser.error(f"{where}: {exc.detail(_flag_of)}")
    return config, console.log_level


def _run_pacer(args: argparse.Namespace) -> int:
    from skewtrace.controller.service import PacerService

    config, log_level = build_pacer_config(args.parser, args, os.environ)
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    service = PacerService(config)
    try:
        service.start()
    except OSError as exc:
        print(f"skewtrace pacer: {exc}", file=sys.stderr)
        return 1

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        service.stop()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    service.wait()
    service.stop()
    return 0


def _add_import(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "import",
        help="send recorded traces (CSV, what-if, PyTorch profiler) as spans, or report on them",
        description="Turn recorded traces into the spans the instrumentation emits and send "
        "them over OTLP to a Collector (by default where the instrumentation sends: "
        "OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4317), or with --report analyse them "
        "with a private otelcol-skewtrace and write the HTML report. The whole input is "
        "checked first: a bad file is an error naming its file and line (or event and "
        "field), exit status 2, nothing sent. See docs/import.md.",
    )
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="FILE",
        help="CSV tables (*.csv), what-if tables (*.parquet, or *.csv with optype and "
        "start_ts columns), or PyTorch profiler traces, one per rank (*.json, *.json.gz, or a "
        "directory of them)",
    )
    parser.add_argument(
        "--format",
        default="auto",
        choices=("auto", "csv", "kineto", "whatif"),
        help="default: by name (and a CSV's header)",
    )
    parser.add_argument(
        "--time-unit",
        default=None,
        metavar="UNIT",
        help="unit of the table's start and duration: s, ms, us or ns (default: s for a CSV "
        "table; for what-if tables the unit an epoch start_ts shows)",
    )
    parser.add_argument(
        "--meta",
        default=None,
        metavar="PATH",
        help="what-if tables: the metadata JSON (dp_size, pp_size, tp_size; default: "
        "<stem>.json, <stem>.meta.json, <stem>_metadata.json, metadata.json or meta.json "
        "beside the table, else inferred from the rows)",
    )
    parser.add_argument(
        "--job",
        default=None,
        help="the job id to send under (default: the CSV's job column, else import-<hash "
        "of the input>)",
    )
    parser.add_argument(
        "--endpoint",
        default=None,
        metavar="URL",
        help="the Collector's OTLP endpoint (default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "
        "OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4317)",
    )
    parser.add_argument(
        "--protocol",
        default=None,
        metavar="PROTOCOL",
        help="grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)",
    )
    parser.add_argument(
        "--report",
        default=None,
        metavar="OUT.html",
        help="instead of sending: analyse with a private Collector and write the HTML report",
    )
    parser.add_argument(
        "--keep-spans",
        default=None,
        metavar="PATH",
        help="with --report: also keep the Collector's span file (for `skewtrace report`)",
    )
    parser.add_argument(
        "--otelcol",
        default=None,
        metavar="PATH",
        help="with --report: the otelcol-skewtrace binary (default: $SKEWTRACE_OTELCOL, "
        "build/otelcol-skewtrace of a checkout, PATH)",
    )
    parser.add_argument(
        "--wait-millis",
        type=int,
        default=120_000,
        metavar="MILLIS",
        help="with --report: how long to wait for every step's analysis (default 120000)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="check the input and say what would be sent"
    )
    parser.set_defaults(run=_run_import)


def _run_import(args: argparse.Namespace) -> int:
    # Imported here: the readers and the OTLP sender are needed by this subcommand only.
    from skewtrace.importer import command

    return command.run(args)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The console script's parser. ``command``: the subcommand about to run, when known.

    The demo's flags come from the fabric emulator's package (:mod:`skewtrace.cluster.command`,
    whose help names the fault presets): they are added only when ``command`` is ``demo`` or
    None (every subcommand complete), so ``skewtrace pacer`` or ``skewtrace --help`` loads
    nothing of :mod:`skewtrace.cluster`; ``demo`` is listed with its one-line help either way.
    """
    parser = argparse.ArgumentParser(prog="skewtrace", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_pacer(subparsers)
    demo = subparsers.add_parser(
        "demo",
        help="the main job: a multi-node job on an emulated leaf/spine fabric with faults, "
        "diagnosed and paced live by the real collector and pacer",
    )
    if command is None or command == "demo":
        from skewtrace.cluster import command as demo_command

        demo_command.add_arguments(demo)
    report_command.add_parser(subparsers)
    advise_command.add_parser(subparsers)
    timeline_command.add_parser(subparsers)
    _add_import(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The top-level parser has no option but --help: its first other word is the command.
    command = next((word for word in argv if not word.startswith("-")), "")
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 2
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
