"""``skewtrace timeline first-change | compare | watch``.

Exit status 0 with a result (also "no regression"), 1 when Prometheus cannot be read (the
message names its URL and what went wrong, no traceback), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import re
import signal
import sys
import time
from types import FrameType
from typing import Any

from skewtrace.timeline.first_change import DEFAULT_LOOKBACK_S
from skewtrace.timeline.prometheus_source import PrometheusSource, prometheus_duration_s

DEFAULT_LISTEN = "127.0.0.1:9466"
PROMETHEUS_ENV = "SKEWTRACE_PROMETHEUS_URL"

_RELATIVE_VALUE = re.compile(r"^-\d[\d.]*(ms|s|m|h|d)?\S*$")


def parse_duration(text: str) -> float:
    """Seconds of ``90``, ``90s``, ``10m``, ``1h30m``, ``2d``."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = prometheus_duration_s(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a duration (90, 90s, 10m, 1h30m)") from None
    if not seconds > 0:
        raise ValueError(f"{text!r}: a duration must be positive")
    return seconds


def parse_time(text: str, now: float) -> float:
    """Unix seconds of ``now``, ``-30m`` (before now), Unix seconds, or RFC 3339."""
    text = text.strip()
    if text == "now":
        return now
    if text[:1] in "+-" and text[1:2].isdigit() and not re.fullmatch(r"[+-]\d+(\.\d+)?", text):
        sign = -1.0 if text[0] == "-" else 1.0
        return now + sign * parse_duration(text[1:])
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time (RFC 3339, Unix seconds, now, or relative like -30m)"
        ) from None
    if moment.tzinfo is None:
        raise ValueError(f"{text!r}: an RFC 3339 time needs its offset (Z or +02:00)")
    return moment.timestamp()


def parse_range(text: str, now: float) -> tuple[float, float]:
    """``START..END`` (each as :func:`parse_time`)."""
    start, sep, end = text.partition("..")
    if not sep:
        raise ValueError(f"{text!r} is not START..END")
    return parse_time(start, now), parse_time(end, now)


def _type(parse: Any) -> Any:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prometheus",
        default=os.environ.get(PROMETHEUS_ENV),
        metavar="URL",
        help=f"the Prometheus that scrapes the Collector [env {PROMETHEUS_ENV}]",
    )
    parser.add_argument("--job", required=True, metavar="ID", help="the training.job.id")
    parser.add_argument(
        "--timeout", type=_type(parse_duration), default=10.0, metavar="DURATION",
        help="per HTTP request to Prometheus (default 10s)",
    )  # fmt: skip
    parser.add_argument(
        "--resolution", type=_type(parse_duration), default=None, metavar="DURATION",
        help="query step (default: the scrape interval, coarser for long ranges)",
    )  # fmt: skip
    parser.add_argument(
        "--rate-window", type=_type(parse_duration), default=None, metavar="DURATION",
        help="window of rate() (default: four query steps)",
    )  # fmt: skip


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "timeline",
        help="find the first component that changed before a slowdown; compare two ranges",
        description="Read the job's series from Prometheus: the first component to change "
        "before the step time regressed (first-change), the same as a service (watch), and "
        "before/after figures of two time ranges (compare). See docs/timeline.md.",
    )
    commands = parser.add_subparsers(dest="timeline_command", metavar="COMMAND")
    parser.set_defaults(run=lambda args: _help(parser))

    first = commands.add_parser("first-change", help="the components that changed first")
    _common(first)
    first.add_argument(
        "--since", type=_type(parse_duration), default=600.0, metavar="DURATION",
        help="look this far back from now (default 10m)",
    )  # fmt: skip
    first.add_argument(
        "--lookback", type=_type(parse_duration), default=DEFAULT_LOOKBACK_S, metavar="DURATION",
        help="a change may start this long before the regression (default 5m)",
    )  # fmt: skip
    first.add_argument(
        "--telemetry-interval", type=_type(parse_duration), default=1.0, metavar="DURATION",
        help="the ranks' node telemetry interval (SKEWTRACE_NODE_TELEMETRY_INTERVAL_MILLIS; "
        "default 1s): node figures can show a change this late",
    )  # fmt: skip
    first.add_argument("--json", action="store_true", help="print the report as JSON")
    first.set_defaults(run=_run_first_change, parser=first)

    comp = commands.add_parser("compare", help="before/after figures of two time ranges")
    _common(comp)
    comp.add_argument("--before", required=True, metavar="START..END")
    comp.add_argument("--after", required=True, metavar="START..END")
    comp.add_argument("--json", action="store_true", help="print the rows as JSON")
    comp.set_defaults(run=_run_compare, parser=comp)
    # Relative times start with "-" (``--before -30m..-20m``): let argparse take them as values,
    # as it does negative numbers (the parser has no option that looks like one).
    comp._negative_number_matcher = _RELATIVE_VALUE

    watch = commands.add_parser("watch", help="first-change every interval, as metrics and spans")
    _common(watch)
    watch.add_argument(
        "--since", type=_type(parse_duration), default=600.0, metavar="DURATION",
        help="each run looks this far back (default 10m)",
    )  # fmt: skip
    watch.add_argument(
        "--interval", type=_type(parse_duration), default=10.0, metavar="DURATION",
        help="between runs (default 10s)",
    )  # fmt: skip
    watch.add_argument(
        "--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
        help=f"serve /metrics here (default {DEFAULT_LISTEN})",
    )  # fmt: skip
    watch.add_argument(
        "--otlp-endpoint", default=None, metavar="URL",
        help="send a timeline.first_change span per regression here (default: the "
        "OTEL_EXPORTER_OTLP_* variables; no spans when neither is set)",
    )  # fmt: skip
    watch.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    watch.set_defaults(run=_run_watch, parser=watch)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _source(args: argparse.Namespace) -> Any:
    if not args.prometheus:
        args.parser.error(f"--prometheus URL is required (or {PROMETHEUS_ENV})")
    return PrometheusSource(
        args.prometheus, timeout_s=args.timeout, step_s=args.resolution,
        rate_window_s=args.rate_window,
    )  # fmt: skip


def _fail(command: str, exc: Exception) -> int:
    print(f"skewtrace timeline {command}: {exc}", file=sys.stderr)
    return 1


def _run_first_change(args: argparse.Namespace) -> int:
    from skewtrace.timeline.first_change import Settings, first_change
    from skewtrace.timeline.source import TimelineError

    source = _source(args)
    now = time.time()
    try:
        settings = Settings(lookback_s=args.lookback, telemetry_interval_s=args.telemetry_interval)
        report = first_change(source, args.job, now - args.since, now, settings)
    except TimelineError as exc:
        return _fail("first-change", exc)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(report.summary())
        effects = [c.component for c in report.changes if c.effect]
        if effects:
            print(f"effects (not causes): {', '.join(effects)}")
        if report.also_changed:
            print(
                "also changed, off the job's path: "
                + ", ".join(f"{c.component} {c.signal}" for c in report.also_changed)
            )
        if report.agreement:
            print(f"the Collector's diagnosis: {report.agreement}")
        for note in report.notes:
            print(f"note: {note}")
    return 0


def _run_compare(args: argparse.Namespace) -> int:
    from skewtrace.timeline.compare import TimeRange, compare
    from skewtrace.timeline.source import TimelineError

    now = time.time()
    ranges = []
    for flag, text in (("--before", args.before), ("--after", args.after)):
        try:
            ranges.append(TimeRange(*parse_range(text, now)))
        except ValueError as exc:
            args.parser.error(f"{flag} {text!r}: {exc}")
    source = _source(args)
    try:
        comparison = compare(source, args.job, ranges[0], ranges[1])
    except TimelineError as exc:
        return _fail("compare", exc)
    if args.json:
        print(json.dumps(comparison.to_json(), indent=1))
    elif comparison.rows:
        print(comparison.table())
    else:
        print(f"job {args.job}: no series with samples in both ranges")
    return 0


def _listen(args: argparse.Namespace) -> tuple[str, int]:
    host, _, port = args.listen.rpartition(":")
    try:
        return host or "127.0.0.1", int(port)
    except ValueError:
        args.parser.error(f"--listen {args.listen!r}: not HOST:PORT")
        raise  # unreachable: error() exits


def _run_watch(args: argparse.Namespace) -> int:
    try:
        from prometheus_client import start_http_server
    except ImportError:
        print(
            "skewtrace timeline watch needs the timeline extra (prometheus-client): "
            "pip install 'skewtrace[timeline]'",
            file=sys.stderr,
        )
        return 2

    from skewtrace.timeline.first_change import Settings
    from skewtrace.timeline.service import WatchConfig, Watcher, timeline_tracer_provider

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log = logging.getLogger("skewtrace.timeline")
    source = _source(args)
    host, port = _listen(args)
    otlp_configured = args.otlp_endpoint or any(
        os.environ.get(v)
        for v in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )
    provider = timeline_tracer_provider(args.otlp_endpoint) if otlp_configured else None
    if provider is None:
        log.info("no --otlp-endpoint or OTEL_EXPORTER_OTLP_ENDPOINT: no spans are sent")
    watcher = Watcher(
        source,
        WatchConfig(args.job, since_s=args.since, interval_s=args.interval, settings=Settings()),
        tracer_provider=provider,
    )
    try:
        server, _thread = start_http_server(port, host, registry=watcher.registry)
    except OSError as exc:
        return _fail("watch", OSError(f"cannot listen on {host}:{port}: {exc}"))
    log.info(
        "serving /metrics on http://%s:%d, job %s, every %g s", host, port, args.job, args.interval
    )

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        watcher.stop()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        watcher.run()
    finally:
        server.shutdown()
        if provider is not None:
            provider.shutdown()
    return 0
