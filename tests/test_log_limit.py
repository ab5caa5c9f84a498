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
