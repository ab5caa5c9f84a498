"""Start and stop real otelcol-skewtrace processes from tests and benchmarks.

    with CollectorProcess(otelcol_path, [OTELCOL_YAML, FILE_EXPORT_YAML], tmp_path) as col:
        send spans to col.otlp_grpc_endpoint ...
        text = col.scrape_prometheus()

Every port is a free 127.0.0.1 port handed to the collector through the `SKEWTRACE_*`
variables its configs read (collector-config/otelcol.yaml lists them), so tests run side by
side. `start()` waits for the health_check extension and fails with the collector's log when
the process exits or never becomes healthy; `stop()` always ends the process (SIGTERM, then
SIGKILL), also when the test failed. Pytest shows the log of a failed test because
`CollectorProcess.__exit__` prints it when the block raised.

Also here: reading the file exporter's OTLP/JSON lines, parsing a Prometheus text
exposition, and building the Go load generator (tools/loadgen).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.samples import Sample

import needs
from skewtrace._ports import free_port
from skewtrace.cluster.metrics import parse_prometheus_text
from skewtrace.report.spans import FileSpan as FileSpan
from skewtrace.report.spans import iter_file_export as iter_file_export
from skewtrace.report.spans import read_file_export as read_file_export

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "collector-config"
OTELCOL_YAML = CONFIG_DIR / "otelcol.yaml"
FILE_EXPORT_YAML = CONFIG_DIR / "file-export.yaml"
GATEWAY_YAML = CONFIG_DIR / "gateway.yaml"
GATEWAY_BY_JOB_YAML = CONFIG_DIR / "gateway-by-job.yaml"
GATEWAY_TIER2_YAML = CONFIG_DIR / "gateway-tier2.yaml"
PASSTHROUGH_YAML = CONFIG_DIR / "passthrough.yaml"
LOADGEN_DIR = REPO_ROOT / "tools" / "loadgen"


@dataclass
class CollectorPorts:
    """The ports one collector listens on, all on 127.0.0.1."""

    otlp_grpc: int = field(default_factory=free_port)
    otlp_http: int = field(default_factory=free_port)
    prometheus: int = field(default_factory=free_port)
    health: int = field(default_factory=free_port)
    telemetry: int = field(default_factory=free_port)

    def env(self) -> dict[str, str]:
        return {
            "SKEWTRACE_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{self.otlp_grpc}",
            "SKEWTRACE_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{self.otlp_http}",
            "SKEWTRACE_PROMETHEUS_ENDPOINT": f"127.0.0.1:{self.prometheus}",
            "SKEWTRACE_HEALTH_ENDPOINT": f"127.0.0.1:{self.health}",
            "SKEWTRACE_OTELCOL_METRICS_HOST": "127.0.0.1",
            "SKEWTRACE_OTELCOL_METRICS_PORT": str(self.telemetry),
        }


def gateway_tier2(
    binary: Path,
    configs: Sequence[Path],
    workdir: Path,
    names: Sequence[str],
    env: dict[str, str] | None = None,
) -> list[CollectorProcess]:
    """Tier-2 instances of the gateway with gateway-tier2.yaml appended to ``configs``: each
    gets a verdict port of its own, and all of them the same list of every verdict endpoint
    (each job's flags are decided on one of them)."""
    ports = {name: free_port() for name in names}
    endpoints = ", ".join(f"127.0.0.1:{p}" for p in ports.values())
    return [
        CollectorProcess(
            binary,
            [*configs, GATEWAY_TIER2_YAML],
            workdir,
            name=name,
            env={
                **(env or {}),
                "SKEWTRACE_VERDICT_GRPC_ENDPOINT": f"127.0.0.1:{port}",
                "SKEWTRACE_VERDICT_ENDPOINTS": f"[{endpoints}]",
            },
        )
        for name, port in ports.items()
    ]


class CollectorError(RuntimeError):
    """The collector exited, never became healthy, or answered wrongly; carries its log."""


class CollectorProcess:
    """One otelcol-skewtrace process with its own ports, log file and file-export path."""

    def __init__(
        self,
        binary: Path,
        configs: Sequence[Path],
        workdir: Path,
        *,
        name: str = "otelcol",
        env: dict[str, str] | None = None,
        ports: CollectorPorts | None = None,
    ) -> None:
        self.binary = Path(binary)
        self.configs = [Path(c) for c in configs]
        self.workdir = Path(workdir)
        self.name = name
        # Ports the harness chose can be chosen again if another process took one first.
        self._ports_chosen_here = ports is None
        self.ports = ports or CollectorPorts()
        self.file_export_path = self.workdir / f"{name}-spans.jsonl"
        self.log_path = self.workdir / f"{name}.log"
        self._given_env = dict(env or {})
        self.env = self._compose_env()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None

    def _compose_env(self) -> dict[str, str]:
        return {
            # Nothing listens there unless a test says otherwise: exports fail and are logged,
            # which is the collector's normal behaviour without a backend or pacer.
            "SKEWTRACE_TRACES_BACKEND_ENDPOINT": f"127.0.0.1:{free_port()}",
            "SKEWTRACE_PACER_OTLP_ENDPOINT": f"127.0.0.1:{free_port()}",
            "SKEWTRACE_FILE_EXPORT_PATH": str(self.file_export_path),
            **self.ports.env(),
            **self._given_env,
        }

    # -- endpoints ---------------------------------------------------------------------------
    @property
    def otlp_grpc_endpoint(self) -> str:
        return f"127.0.0.1:{self.ports.otlp_grpc}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.prometheus}/metrics"

    @property
    def telemetry_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.telemetry}/metrics"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise CollectorError(f"{self.name} is not running")
        return self._proc.pid

    # -- lifecycle ---------------------------------------------------------------------------
    def command(self) -> list[str]:
        cmd = [str(self.binary)]
        for config in self.configs:
            cmd += ["--config", str(config)]
        return cmd

    def start(self, timeout_s: float = 30.0, port_retries: int = 2) -> CollectorProcess:
        """Start the collector and wait until it is healthy. When one of the ports the
        harness chose was taken in between (another process bound it first), it starts again
        on new ones, up to ``port_retries`` times; ports a test gave are never changed."""
        for attempt in range(port_retries + 1):
            try:
                return self._start_once(timeout_s)
            except CollectorError:
                taken = "address already in use" in self.log_text()
                if not (taken and self._ports_chosen_here and attempt < port_retries):
                    raise
                self.ports = CollectorPorts()
                self.env = self._compose_env()
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float) -> CollectorProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        env = {**os.environ, **self.env}
        self._proc = subprocess.Popen(
            self.command(),
            cwd=self.workdir,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self.wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout_s: float) -> None:
        url = f"http://127.0.0.1:{self.ports.health}/"
        deadline = time.monotonic() + timeout_s
        last_error = "no answer"
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise CollectorError(
                    f"{self.name} exited with {self._proc.returncode} before it was healthy\n"
                    + self.log_tail()
                )
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        return
                    last_error = f"HTTP {resp.status}"
            except (urllib.error.URLError, OSError) as exc:
                last_error = str(exc)
            time.sleep(0.1)
        raise CollectorError(
            f"{self.name} not healthy at {url} after {timeout_s}s ({last_error})\n"
            + self.log_tail()
        )

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM (the collector flushes its exporters), then SIGKILL; returns the exit code."""
        proc, self._proc = self._proc, None
        code: int | None = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
            code = proc.returncode
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return code

    def __enter__(self) -> CollectorProcess:
        return self.start()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.stop()
        if exc_type is not None:
            # Captured by pytest and shown under the failing test.
            sys.stdout.write(f"\n----- {self.name} log ({self.log_path}) -----\n")
            sys.stdout.write(self.log_tail(200) + "\n")

    # -- output ------------------------------------------------------------------------------
    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def scrape_prometheus(self, openmetrics: bool = False) -> str:
        return scrape(self.prometheus_url, openmetrics=openmetrics)

    def exported_spans(self) -> list[FileSpan]:
        return read_file_export(self.file_export_path)


def scrape(url: str, *, openmetrics: bool = False, timeout_s: float = 5.0) -> str:
    request = urllib.request.Request(url)
    if openmetrics:
        request.add_header("Accept", "application/openmetrics-text; version=1.0.0")
    with urllib.request.urlopen(request, timeout=timeout_s) as resp:
        return resp.read().decode()


# -- Prometheus text -----------------------------------------------------------------------

# One parser for the exposition text: the demo's (exemplars dropped, unparsable lines skipped).
parse_prometheus = parse_prometheus_text


def sum_samples(samples: Sequence[Sample], name: str, **labels: str) -> float:
    """The sum of the values of the samples :func:`find_samples` finds."""
    return sum(s.value for s in find_samples(samples, name, **labels))


def find_samples(samples: Sequence[Sample], name: str, **labels: str) -> list[Sample]:
    return [
        s
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


# -- the file exporter's OTLP/JSON ----------------------------------------------------------

# One reader of the format: the package's (skewtrace.report.spans), imported above. The
# HTML report reads the same files. iter_file_export yields nothing while the file does not
# exist and leaves a last line without its newline for the next read.


# -- the Go load generator -------------------------------------------------------------------


def build_loadgen(out: Path | None = None) -> Path:
    """`go build` tools/loadgen (seconds when Go's build cache is warm). Test workers build
    it side by side: one at a time (a lock file beside it), and the binary replaced at once,
    so a worker running the previous build is not disturbed."""
    import fcntl

    out = out or REPO_ROOT / "build" / "loadgen"
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{os.getpid()}")
    with open(out.with_name(f".{out.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = subprocess.run(
            ["go", "build", "-o", str(partial), "."],
            cwd=LOADGEN_DIR,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"building tools/loadgen failed:\n{result.stdout}{result.stderr}")
        os.replace(partial, out)
    return out


def loadgen_for_tests() -> Path:
    """tools/loadgen for a test: skipped without Go on a developer machine, failed in CI."""
    if shutil.which("go") is None:
        needs.unavailable("Go is not installed (needed to build tools/loadgen)")
    return build_loadgen()


def run_loadgen_send(loadgen: Path, endpoint: str, *args: str, timeout_s: float = 300) -> dict:
    """Run `loadgen send` to completion; returns its JSON summary."""
    result = subprocess.run(
        [str(loadgen), "send", "-endpoint", endpoint, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if result.returncode != 0:
        raise RuntimeError(f"loadgen send failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
