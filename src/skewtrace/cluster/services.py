"""The Collector and the pacer of the main job, started where the cluster keeps its services.

On the emulated fabric they run in the operations namespace: ranks reach them over the
management network, and the orchestrator reads them by entering that namespace from one
thread (:func:`skewtrace.cluster.netns.entered`). On loopback they listen on 127.0.0.1.
Both are the real programs: ``otelcol-skewtrace`` with the shipped configs and ``skewtrace
pacer``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from skewtrace._ports import free_port
from skewtrace.cluster import netns


class ServiceHost(Protocol):
    """What services need of a cluster (Fabric and Loopback both have it)."""

    @property
    def service_host(self) -> str: ...

    @property
    def driver_netns(self) -> str | None: ...

    def service_argv(self, argv: list[str]) -> list[str]: ...


RESPONSIVE = {"SKEWTRACE_ANALYSIS_DELAY": "500ms", "SKEWTRACE_METRICS_FLUSH_INTERVAL": "250ms"}
"""The Collector's settings for the main job, unless the environment sets them."""


class ServiceError(RuntimeError):
    """A service did not start; the message has the end of its log."""


@contextmanager
def _process(
    cmd: list[str], env: Mapping[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=dict(env), stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass
class Services:
    """``with Services(cluster, otelcol, configs, workdir) as services:`` starts both and
    waits until they answer; leaving the block stops them."""

    cluster: ServiceHost
    otelcol: Path
    configs: list[Path]
    workdir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    pacer_args: Sequence[str] = ()
    """More ``skewtrace pacer`` flags (e.g. ``--policy interleave``)."""
    ports: dict[str, int] = field(init=False)
    spans_path: Path = field(init=False)

    def __post_init__(self) -> None:
        names = ("otlp_grpc", "otlp_http", "prom", "health", "own", "pacer_grpc", "pacer_http")
        if self.cluster.driver_netns is None:
            self.ports = {name: free_port() for name in names}
        else:  # a namespace of our own: every port is free
            self.ports = dict(zip(names, (4317, 4318, 8889, 13133, 8888, 4321, 4320), strict=True))
        self.spans_path = self.workdir / "spans.jsonl"
        self._stack: list[AbstractContextManager[Any]] = []

    @property
    def otlp_for_ranks(self) -> str:
        return f"http://{self.cluster.service_host}:{self.ports['otlp_grpc']}"

    @property
    def pacer_for_ranks(self) -> str:
        return f"http://{self.cluster.service_host}:{self.ports['pacer_http']}"

    @property
    def prometheus_url(self) -> str:
        """As the orchestrator reads it (inside :meth:`reach`)."""
        return f"http://127.0.0.1:{self.ports['prom']}/metrics"

    def reach(self) -> AbstractContextManager[None]:
        """Enter the services' namespace (this thread) for a request."""
        ns = self.cluster.driver_netns
        return nullcontext() if ns is None else netns.entered(ns)

    def get(self, url: str, timeout_s: float = 5.0) -> str:
        with self.reach(), urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return str(resp.read().decode())

    def scrape(self) -> str:
        return self.get(self.prometheus_url)

    def pacing(self, job_id: str) -> dict[str, Any]:
        url = f"http://{self.cluster.service_host}:{self.ports['pacer_http']}"
        try:
            answer = json.loads(self.get(f"{url}/v1/pacing?job={job_id}", timeout_s=2.0))
        except (OSError, ValueError):
            return {}
        return answer if isinstance(answer, dict) else {}

    def __enter__(self) -> Services:
        host, ports = self.cluster.service_host, self.ports
        env = dict(self.env)
        # A verdict within about a second of the step that shows it (the defaults favour
        # fewer, larger batches): docs/deployment.md, "Environment".
        for name, value in RESPONSIVE.items():
            env.setdefault(name, value)
        env.update(
            {
                "SKEWTRACE_OTLP_GRPC_ENDPOINT": f"{host}:{ports['otlp_grpc']}",
                "SKEWTRACE_OTLP_HTTP_ENDPOINT": f"{host}:{ports['otlp_http']}",
                "SKEWTRACE_PROMETHEUS_ENDPOINT": f"127.0.0.1:{ports['prom']}",
                "SKEWTRACE_HEALTH_ENDPOINT": f"127.0.0.1:{ports['health']}",
                "SKEWTRACE_OTELCOL_METRICS_PORT": str(ports["own"]),
                "SKEWTRACE_PACER_OTLP_ENDPOINT": f"127.0.0.1:{ports['pacer_grpc']}",
                "SKEWTRACE_FILE_EXPORT_PATH": str(self.spans_path),
            }
        )
        collector = [str(self.otelcol)] + [a for c in self.configs for a in ("--config", str(c))]
        pacer = [
            sys.executable, "-m", "skewtrace.cli", "pacer",
            "--otlp-grpc", f"127.0.0.1:{ports['pacer_grpc']}",
            "--http", f"{host}:{ports['pacer_http']}",
            *self.pacer_args,
        ]  # fmt: skip
        try:
            col = self._enter(
                _process(self.cluster.service_argv(collector), env, self.log("otelcol"))
            )
            pac = self._enter(_process(self.cluster.service_argv(pacer), env, self.log("pacer")))
            self._wait_ok(f"http://127.0.0.1:{ports['health']}/", 60, col, self.log("otelcol"))
            self._wait_ok(
                f"http://{host}:{ports['pacer_http']}/healthz", 30, pac, self.log("pacer")
            )
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def _enter(
        self, cm: AbstractContextManager[subprocess.Popen[bytes]]
    ) -> subprocess.Popen[bytes]:
        proc = cm.__enter__()
        self._stack.append(cm)
        return proc

    def _wait_ok(
        self, url: str, timeout_s: float, proc: subprocess.Popen[bytes], log: Path
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServiceError(
                    f"{' '.join(map(str, proc.args))} exited ({proc.returncode}); {log}:\n"  # type: ignore[arg-type]
                    + log.read_text(errors="replace")[-3000:]
                )
            try:
                self.get(url, timeout_s=1.0)
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        raise ServiceError(f"{url} did not answer within {timeout_s:.0f} s; see {log}")

    def __exit__(self, *exc: object) -> None:
        while self._stack:
            self._stack.pop().__exit__(None, None, None)
