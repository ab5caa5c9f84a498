"""Rate limit for the OTLP exporters' own log lines while the endpoint is down.

The SDK's OTLP exporters log every retry and every failed export. With a collector down,
that is several lines per second per rank for the whole run: noise that buries the training
log. While skewtrace's private exporters are in use, each *kind* of message of those loggers
passes once per ``interval_s``; the next one that passes says how many were held back.
Failures are still counted (``skewtrace.spans.export_failed``), so nothing is hidden.

A kind is the logger and the message with its numbers made one (:func:`message_kind`):
"Transient error StatusCode.UNAVAILABLE encountered while exporting traces to
localhost:4317, retrying in 1.03s." and the same with "0.87s" are one kind, whether the
delay is an argument of a ``%`` template (the SDK 1.45's form: the template is the kind) or
was formatted into the text beforehand (an f-string: the text, numbers made one, is).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

# The loggers of the SDK modules that log per retry / per failed export.
EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    # The HTTP client's own logger, when an exporter does not hand it its own.
    "opentelemetry.exporter.otlp.common.http",
)

# Integers, decimals, and dotted or colon-separated runs of them (1.03, 127.0.0.1:4317).
_NUMBER = re.compile(r"\d+(?:[.:,]\d+)*")
_KIND_CHARS = 300


def message_kind(record: logging.LogRecord) -> str:
    """What makes two records the same kind: the message as written at the call (the ``%``
    template, or the text of a pre-formatted message), numbers replaced by ``#``."""
    return _NUMBER.sub("#", str(record.msg))[:_KIND_CHARS]


class RepeatLimitFilter(logging.Filter):
    """Passes each (logger, :func:`message_kind`) at most once per ``interval_s``."""

    def __init__(self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        # (logger name, message kind) -> (time it last passed, records held back since)
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, message_kind(record))
        now = self._clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self._interval_s:
                self._seen[key] = (last[0], last[1] + 1)
                return False
            held = last[1] if last is not None else 0
            if len(self._seen) > 256:  # kinds: a handful in practice
                self._seen.clear()
            self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} [skewtrace: {held} similar messages held back]"
        return True


_installed: RepeatLimitFilter | None = None
_users = 0
_install_lock = threading.Lock()


def install() -> None:
    """Adds the filter to the exporter loggers (counted: one removal per install)."""
    global _installed, _users
    with _install_lock:
        _users += 1
        if _installed is None:
            _installed = RepeatLimitFilter()
            for name in EXPORTER_LOGGERS:
                logging.getLogger(name).addFilter(_installed)


def uninstall() -> None:
    global _installed, _users
    with _install_lock:
        _users = max(0, _users - 1)
        if _users == 0 and _installed is not None:
            for name in EXPORTER_LOGGERS:
                logging.getLogger(name).removeFilter(_installed)
            _installed = None
