"""The ``skewtrace`` console script.

Subcommands:

- ``skewtrace pacer``: run the pacing controller (see ``docs/pacing.md``).
- ``skewtrace demo``: the collector, the pacer and a 4-rank job with a straggler, end to end.

Every ``pacer`` flag can also come from an environment variable ``SKEWTRACE_PACER_<FLAG>``
(the flag upper-cased, dashes as underscores: ``--window-s`` is ``SKEWTRACE_PACER_WINDOW_S``);
a flag on the command line wins. A value that cannot be used is an error naming the flag (and
the variable, when it came from one), exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from skewtrace import demo
from skewtrace.pacer.policy import PolicyParams
from skewtrace.pacer.service import PacerConfig

ENV_PREFIX = "SKEWTRACE_PACER_"
# The config classes hold the defaults; the flags show them.
_POLICY = PolicyParams()
_CONFIG = PacerConfig()


@dataclass(frozen=True)
class _Option:
    flag: str
    parse: Callable[[str], Any]
    default: Any
    help: str

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


def _host_port(raw: str) -> tuple[str, int]:
    host, sep, port = raw.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("expected HOST:PORT, e.g. 127.0.0.1:4320")
    return host, int(port)


def _positive(raw: str) -> float:
    value = float(raw)
    if not (math.isfinite(value) and value > 0):
        raise ValueError("expected a positive number")
    return value


def _non_negative(raw: str) -> float:
    value = float(raw)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError("expected a number >= 0")
    return value


def _fraction(raw: str) -> float:
    value = float(raw)
    if not (math.isfinite(value) and 0 < value <= 1):
        raise ValueError("expected a number in (0, 1]")
    return value


def _count(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError("expected an integer >= 1")
    return value


def _text(raw: str) -> str:
    if not raw.strip():
        raise ValueError("must not be empty")
    return raw.strip()


_PACER_OPTIONS = (
    _Option(
        "--otlp-grpc",
        _host_port,
        ("127.0.0.1", 4321),
        "where the Collector pushes OTLP/gRPC metrics",
    ),
    _Option(
        "--http",
        _host_port,
        ("127.0.0.1", 4320),
        "where ranks GET /v1/pacing?job=ID",
    ),
    _Option("--token", _text, None, "bearer token required on /v1/*"),
    _Option("--window-s", _positive, _CONFIG.window_s, "seconds of metrics each decision looks at"),
    _Option(
        "--decision-interval-s", _positive, _CONFIG.decision_interval_s, "seconds between decisions"
    ),
    _Option(
        "--activate-threshold",
        _positive,
        _POLICY.activate_threshold,
        "natural arrival spread per step / step time that turns pacing on",
    ),
    _Option(
        "--deactivate-threshold",
        _non_negative,
        _POLICY.deactivate_threshold,
        "spread below which pacing turns off; < activate threshold",
    ),
    _Option(
        "--activate-hold-s",
        _non_negative,
        _POLICY.activate_hold_s,
        "seconds the spread must stay above the activate threshold",
    ),
    _Option(
        "--deactivate-hold-s",
        _non_negative,
        _POLICY.deactivate_hold_s,
        "seconds the spread must stay below the deactivate threshold",
    ),
    _Option("--max-delay", _non_negative, _POLICY.max_delay_s, "largest delay published, seconds"),
    _Option(
        "--wait-fraction",
        _fraction,
        _POLICY.wait_fraction,
        "a delay is at most this fraction of the rank's natural wait per step",
    ),
    _Option(
        "--margin-s",
        _non_negative,
        _POLICY.margin_s,
        "a delay stays this far below the rank's natural wait per step",
    ),
    _Option(
        "--gain",
        _fraction,
        _POLICY.gain,
        "fraction of the way each decision moves a delay toward its target",
    ),
    _Option(
        "--min-steps", _count, _POLICY.min_steps, "steps a rank needs in the window to be judged"
    ),
    _Option(
        "--ineffective-hold-s",
        _non_negative,
        _POLICY.ineffective_hold_s,
        "stop pacing a rank whose delays have not shown in its wait for this long",
    ),
    _Option(
        "--rank-timeout-s",
        _positive,
        _CONFIG.rank_timeout_s,
        "a rank with no new steps for this long is left out",
    ),
    _Option(
        "--job-timeout-s",
        _positive,
        _CONFIG.job_timeout_s,
        "a job with no metrics for this long is forgotten",
    ),
    _Option(
        "--metrics-endpoint",
        _text,
        None,
        "OTLP/gRPC endpoint for the pacer's own metrics; none: not exported",
    ),
    _Option(
        "--metrics-interval-s",
        _positive,
        _CONFIG.metrics_interval_s,
        "export period of the pacer's own metrics",
    ),
    _Option(
        "--log-level",
        lambda raw: _choice(raw, ("debug", "info", "warning", "error")),
        "info",
        "debug, info, warning or error",
    ),
)

# Field names the config classes use in their errors, and the flag a user would fix.
_FIELD_FLAGS = {
    "activate_threshold": "--activate-threshold",
    "deactivate_threshold": "--deactivate-threshold",
    "activate_hold_s": "--activate-hold-s",
    "deactivate_hold_s": "--deactivate-hold-s",
    "max_delay_s": "--max-delay",
    "wait_fraction": "--wait-fraction",
    "margin_s": "--margin-s",
    "window_s": "--window-s",
    "rank_timeout_s": "--rank-timeout-s",
    "ineffective_hold_s": "--ineffective-hold-s",
}


def _choice(raw: str, choices: Sequence[str]) -> str:
    value = raw.strip().lower()
    if value not in choices:
        raise ValueError(f"expected one of {', '.join(choices)}")
    return value


def _show(default: Any) -> str:
    if isinstance(default, tuple):
        return f"{default[0]}:{default[1]}"
    return "none" if default is None else str(default)


def _add_pacer(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "pacer",
        help="run the pacing controller",
        description="Receive the barrierskew metrics by OTLP/gRPC and serve per-rank pacing "
        f"delays over HTTP. Every flag can be set as {ENV_PREFIX}<FLAG> as well.",
    )
    for option in _PACER_OPTIONS:
        parser.add_argument(
            option.flag,
            dest=option.dest,
            default=None,
            metavar="VALUE",
            help=f"{option.help} (default {_show(option.default)}) [env {option.env}]",
        )
    parser.set_defaults(run=_run_pacer, parser=parser)


def _resolve(
    parser: argparse.ArgumentParser, args: argparse.Namespace, env: Mapping[str, str]
) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for option in _PACER_OPTIONS:
        raw = getattr(args, option.dest)
        source = option.flag
        if raw is None and env.get(option.env, "").strip():
            raw, source = env[option.env], f"{option.flag} (from {option.env})"
        if raw is None:
            values[option.dest] = option.default
            continue
        try:
            values[option.dest] = option.parse(raw)
        except ValueError as exc:
            detail = str(exc) if "expected" in str(exc) or "must" in str(exc) else "invalid value"
            parser.error(f"{source}={raw!r}: {detail}")
    return values


def build_pacer_config(
    parser: argparse.ArgumentParser, args: argparse.Namespace, env: Mapping[str, str]
) -> tuple[Any, str]:
    """(PacerConfig, log level) from flags and environment; exits 2 naming the bad flag."""
    values = _resolve(parser, args, env)
    try:
        policy = PolicyParams(
            activate_threshold=values["activate_threshold"],
            deactivate_threshold=values["deactivate_threshold"],
            activate_hold_s=values["activate_hold_s"],
            deactivate_hold_s=values["deactivate_hold_s"],
            max_delay_s=values["max_delay"],
            wait_fraction=values["wait_fraction"],
            margin_s=values["margin_s"],
            gain=values["gain"],
            min_steps=values["min_steps"],
            ineffective_hold_s=values["ineffective_hold_s"],
        )
        config = PacerConfig(
            otlp_host=values["otlp_grpc"][0],
            otlp_port=values["otlp_grpc"][1],
            http_host=values["http"][0],
            http_port=values["http"][1],
            token=values["token"],
            window_s=values["window_s"],
            decision_interval_s=values["decision_interval_s"],
            rank_timeout_s=values["rank_timeout_s"],
            job_timeout_s=values["job_timeout_s"],
            policy=policy,
            metrics_endpoint=values["metrics_endpoint"],
            metrics_interval_s=values["metrics_interval_s"],
        )
    except ValueError as exc:
        message = str(exc)
        for field_name, flag in sorted(_FIELD_FLAGS.items(), key=lambda kv: -len(kv[0])):
            message = message.replace(field_name, flag)
        parser.error(message)
    return config, values["log_level"]


def _run_pacer(args: argparse.Namespace) -> int:
    from skewtrace.pacer.service import PacerService

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="skewtrace", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_pacer(subparsers)
    demo.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 2
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
