"""A private ``otelcol-skewtrace`` for ``skewtrace import --report``: the real analysis, locally.

It runs the shipped ``collector-config/otelcol.yaml`` with ``file-export.yaml`` (the
configuration the demo and the tests run), every listener on a free 127.0.0.1 port, the span
file in a working directory; the trace backend and pacer endpoints point at ports where
nothing listens (those exports fail and are logged, which changes nothing in the analysis).
:func:`wait_for_summaries` follows the span file until every step has its
``train.step.summary``; stopping the Collector (SIGTERM) makes it analyse and write what is
still open.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from skewtrace import _resources, semconv
from skewtrace._ports import free_port
from skewtrace.report.spans import SpanFileReader

CONFIGS = ("collector-config/otelcol.yaml", "collector-config/file-export.yaml")
SETTINGS = {"SKEWTRACE_ANALYSIS_DELAY": "300ms", "SKEWTRACE_METRICS_FLUSH_INTERVAL": "250ms"}
"""The Collector's settings here, unless the environment sets them: a step is analysed
0.3 s after its last span instead of 1 s (the spans all arrive at once)."""


class CollectorError(RuntimeError):
    """The Collector is missing, did not start, or stopped; the message says what to do."""


def find_binary(given: str | None, env: Mapping[str, str] | None = None) -> Path:
    """``given`` (``--otelcol``), else :func:`skewtrace._resources.find_otelcol`'s order
    (``SKEWTRACE_OTELCOL``, the checkout's ``build/``, ``PATH``, the cache)."""
    env = os.environ if env is None else env
    if given:
        path = Path(given)
        if not path.is_file():
            raise CollectorError(f"--otelcol {path}: not a file")
        return path
    lookup = _resources.find_otelcol(env)
    if lookup.found is not None:
        return lookup.found
    raise CollectorError(
        f"{_resources.OTELCOL} not found (looked at: {', '.join(lookup.tried)}). Build it in "
        f"a checkout with `make collector` (writes build/{_resources.OTELCOL}; seconds with "
        f"Go's caches warm, Go >= 1.26 needed), then run this again, or pass --otelcol PATH "
        f"or set {_resources.SKEWTRACE_OTELCOL}=PATH to use a binary built elsewhere."
    )


class LocalCollector:
    """``with LocalCollector(binary, workdir) as collector:`` starts it and waits until it is
    healthy; leaving the block stops it (SIGTERM, then SIGKILL)."""

    def __init__(self, binary: Path, workdir: Path, env: Mapping[str, str] | None = None) -> None:
        self.binary = binary
        self.workdir = workdir
        self.spans_path = workdir / "spans.jsonl"
        self.log_path = workdir / "otelcol.log"
        self.otlp_port = free_port()
        self._health = free_port()
        configs = [_resources.shipped(name) for name in CONFIGS]
        missing = [name for name, path in zip(CONFIGS, configs, strict=True) if path is None]
        if missing:
            raise CollectorError(f"{', '.join(missing)} missing from this installation")
        self._configs = [path for path in configs if path is not None]
        environ = dict(os.environ if env is None else env)
        for name, value in SETTINGS.items():
            environ.setdefault(name, value)
        environ.update(
            {
                "SKEWTRACE_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{self.otlp_port}",
                "SKEWTRACE_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{free_port()}",
                "SKEWTRACE_PROMETHEUS_ENDPOINT": f"127.0.0.1:{free_port()}",
                "SKEWTRACE_HEALTH_ENDPOINT": f"127.0.0.1:{self._health}",
                "SKEWTRACE_OTELCOL_METRICS_HOST": "127.0.0.1",
                "SKEWTRACE_OTELCOL_METRICS_PORT": str(free_port()),
                "SKEWTRACE_TRACES_BACKEND_ENDPOINT": f"127.0.0.1:{free_port()}",
                "SKEWTRACE_PACER_OTLP_ENDPOINT": f"127.0.0.1:{free_port()}",
                "SKEWTRACE_FILE_EXPORT_PATH": str(self.spans_path),
            }
        )
        self._env = environ
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def otlp_endpoint(self) -> str:
        return f"127.0.0.1:{self.otlp_port}"

    def __enter__(self) -> LocalCollector:
        command = [str(self.binary)]
        for config in self._configs:
            command += ["--config", str(config)]
        self._log = self.log_path.open("wb")
        try:
            self._proc = subprocess.Popen(
                command,
                cwd=self.workdir,
                env=self._env,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            self._close_log()
            raise CollectorError(f"cannot run {self.binary}: {exc.strerror or exc}") from None
        try:
            self._wait_healthy(60.0)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _wait_healthy(self, timeout_s: float) -> None:
        url = f"http://127.0.0.1:{self._health}/"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.running():
                code = self._proc.returncode if self._proc is not None else None
                raise CollectorError(
                    f"{self.binary} exited ({code}) before it was ready; its log:\n"
                    + self.log_tail()
                )
            try:
                with urllib.request.urlopen(url, timeout=1) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise CollectorError(
            f"{self.binary} not ready after {timeout_s:.0f} s; its log:\n{self.log_tail()}"
        )

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (it analyses open steps and flushes the file), then SIGKILL."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def summarized_steps(spans_path: Path, job: str) -> set[int]:
    """The steps of ``job`` that have a ``train.step.summary`` in the span file so far."""
    reader = SpanFileReader(spans_path, job=job, line_contains=semconv.SPAN_STEP_SUMMARY.encode())
    try:
        return {
            int(span.attributes[semconv.STEP])
            for span in reader
            if span.name == semconv.SPAN_STEP_SUMMARY and semconv.STEP in span.attributes
        }
    except FileNotFoundError:
        return set()


def wait_for_summaries(
    collector: LocalCollector, job: str, steps: set[int], timeout_s: float
) -> set[int]:
    """Poll the span file until every step in ``steps`` has its summary, the Collector
    stopped, or ``timeout_s`` passed; returns the steps still without one."""
    deadline = time.monotonic() + timeout_s
    missing = set(steps)
    while missing and collector.running() and time.monotonic() < deadline:
        time.sleep(0.2)
        missing -= summarized_steps(collector.spans_path, job)
    return missing
