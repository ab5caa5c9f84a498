"""The rate limit on the OTLP exporters' log lines while the collector is down."""

from __future__ import annotations

import logging

import pytest

from skewtrace import _log_limit
from skewtrace._log_limit import EXPORTER_LOGGERS, RepeatLimitFilter


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(msg: str, *args: object, name: str = EXPORTER_LOGGERS[0]) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)


def test_repeats_pass_once_per_interval_and_report_what_was_held() -> None:
    clock = _Clock()
    limit = RepeatLimitFilter(interval_s=60.0, clock=clock)
    template = "Transient error %s encountered while exporting traces to %s, retrying in %.2fs."
    assert limit.filter(_record(template, "UNAVAILABLE", "127.0.0.1:4317", 1.0))
    clock.now = 1.0
    assert not limit.filter(_record(template, "UNAVAILABLE", "127.0.0.1:4317", 0.9))
    clock.now = 30.0
    assert not limit.filter(_record(template, "UNAVAILABLE", "127.0.0.1:4317", 1.1))
    # Another message is its own stream.
    assert limit.filter(_record("Failed to export traces to %s", "127.0.0.1:4317"))
    clock.now = 61.0
    passed = _record(template, "UNAVAILABLE", "127.0.0.1:4317", 1.0)
    assert limit.filter(passed)
    assert "2 similar messages held back" in passed.getMessage()
    clock.now = 62.0
    assert not limit.filter(_record(template, "UNAVAILABLE", "127.0.0.1:4317", 1.0))


def test_install_limits_the_sdk_exporter_logger_and_uninstall_removes_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sdk_logger = logging.getLogger("opentelemetry.exporter.otlp.proto.grpc.exporter")
    _log_limit.install()
    try:
        with caplog.at_level(logging.WARNING, logger=sdk_logger.name):
            for _ in range(5):
                sdk_logger.warning("Transient error, retrying in %.2fs", 1.0)
                sdk_logger.warning("Failed to export traces to %s", "127.0.0.1:1")
        assert len([r for r in caplog.records if r.name == sdk_logger.name]) == 2
    finally:
        _log_limit.uninstall()
    assert not any(isinstance(f, RepeatLimitFilter) for f in sdk_logger.filters)
    caplog.clear()
    # Alternating messages, as the SDK logs them (retry, failure, retry, ...): the SDK's own
    # DuplicateFilter on this logger only drops a record equal to the one just before it.
    with caplog.at_level(logging.WARNING, logger=sdk_logger.name):
        for _ in range(3):
            sdk_logger.warning("Transient error, retrying in %.2fs", 1.0)
            sdk_logger.warning("Failed to export traces to %s", "127.0.0.1:1")
    assert len([r for r in caplog.records if r.name == sdk_logger.name]) == 6


def test_one_kind_whatever_its_numbers_pre_formatted_or_templated() -> None:
    """With the collector down each retry line differs in its delay (the SDK adds jitter):
    still one kind, whether the delay is a ``%`` argument or formatted into the text."""
    clock = _Clock()
    limit = RepeatLimitFilter(interval_s=60.0, clock=clock)
    endpoint = "localhost:4317"
    passed = []
    for i, delay in enumerate((1.03, 0.87, 1.91, 3.62, 7.4)):
        clock.now = float(i)
        # As an SDK that formats with an f-string logs it: no args, the text varies.
        text = (
            f"Transient error StatusCode.UNAVAILABLE encountered while exporting traces to "
            f"{endpoint}, retrying in {delay:.2f}s."
        )
        passed.append(limit.filter(_record(text)))
    assert passed == [True, False, False, False, False]
    # The SDK 1.45 form, a template with the delay as an argument: also one kind.
    template = (
        "Transient error %s encountered while exporting %s to %s, retrying in %.2fs. "
        "Error details: %s"
    )
    args = ("StatusCode.UNAVAILABLE", "traces", endpoint)
    assert limit.filter(_record(template, *args, 1.03, "failed to connect"))
    assert not limit.filter(_record(template, *args, 0.91, "failed to connect"))
    # Other kinds, and the same kind on another logger, are their own streams.
    assert limit.filter(_record(f"Failed to export traces to {endpoint}, error code: 14"))
    assert limit.filter(_record(text, name=EXPORTER_LOGGERS[1]))
    clock.now = 61.0
    last = _record(text.replace("7.40", "0.52"))
    assert limit.filter(last)
    assert "4 similar messages held back" in last.getMessage()


def test_the_sdks_http_client_lines_are_limited_too() -> None:
    """The HTTP exporters log their retries through the exporter's logger, or the client's."""
    assert "opentelemetry.exporter.otlp.common.http" in EXPORTER_LOGGERS
    limit = RepeatLimitFilter(interval_s=60.0, clock=_Clock())
    template = "Transient error %s encountered while exporting %s batch, retrying in %.2fs."
    name = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
    assert limit.filter(_record(template, "Connection refused", "span", 1.1, name=name))
    assert not limit.filter(_record(template, "Connection refused", "span", 2.3, name=name))
