"""A real Prometheus for tests, and the PromQL of the dashboards in a form it can run.

``PrometheusServer`` runs the ``prometheus`` binary (Debian's package; ``.ci/run`` installs it)
on a free 127.0.0.1 port with its own config and data directory, scraping the targets it is
given, and answers PromQL through the HTTP API. ``dashboard_queries`` lists every Prometheus
expression of a Grafana dashboard and ``substitute_variables`` turns Grafana's ``$variables``
into what Grafana would send, so tests can run the dashboard's queries for real.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PROMETHEUS_UID = "skewtrace-prometheus"

# What Grafana sends for its built-in interval variables, for a scrape interval of 1 s and a
# short test range. $__rate_interval is at least four scrape intervals, so rate() has samples.
DEFAULT_BUILTINS = {
    "__rate_interval": "30s",
    "__interval": "5s",
    "__range": "5m",
    "__range_s": "300",
    "__interval_ms": "5000",
}


def find_binary(name: str) -> str | None:
    """The path of ``name`` on PATH or in /usr/bin, None when absent."""
    return shutil.which(name) or (
        f"/usr/bin/{name}" if os.path.isfile(f"/usr/bin/{name}") else None
    )


@dataclass(frozen=True)
class PanelQuery:
    """One Prometheus target of one dashboard panel."""

    panel_id: int
    panel_title: str
    ref_id: str
    expr: str
    instant: bool

    @property
    def label(self) -> str:
        return f"panel {self.panel_id} {self.panel_title!r} target {self.ref_id}"


def iter_panels(dashboard: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def _datasource_uid(node: Mapping[str, Any]) -> str | None:
    datasource = node.get("datasource")
    if isinstance(datasource, Mapping):
        uid = datasource.get("uid")
        return str(uid) if uid is not None else None
    return None


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[PanelQuery]:
    """The Prometheus expressions of every panel and annotation (other datasources skipped)."""
    queries = []
    for panel in iter_panels(dashboard):
        panel_uid = _datasource_uid(panel)
        for target in panel.get("targets", []):
            uid = _datasource_uid(target) or panel_uid
            if uid != PROMETHEUS_UID:
                continue
            queries.append(
                PanelQuery(
                    panel_id=int(panel["id"]),
                    panel_title=str(panel.get("title", "")),
                    ref_id=str(target.get("refId", "")),
                    expr=str(target.get("expr", "")),
                    instant=bool(target.get("instant", False)) and not target.get("range", False),
                )
            )
    # Annotation queries run in Prometheus the same way (a range query over the dashboard's
    # time range); they are numbered 0 and named after the annotation.
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if _datasource_uid(annotation) != PROMETHEUS_UID:
            continue
        queries.append(
            PanelQuery(
                panel_id=0,
                panel_title=f"annotation: {annotation.get('name', '')}",
                ref_id="annotation",
                expr=str(annotation.get("expr", "")),
                instant=False,
            )
        )
    return queries


_VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)|\[\[(\w+)\]\]")


def grafana_regex_value(values: Sequence[str]) -> str:
    """What Grafana's Prometheus datasource puts in a query for a multi-value variable:
    regex metacharacters escaped (doubled backslash, since it lands in a PromQL string) and
    several values joined as an alternation."""

    def escape(value: str) -> str:
        value = value.replace("\\", "\\\\\\\\")
        return re.sub(r"([$^*{}\[\]'+?.()|])", r"\\\\\1", value)

    escaped = [escape(value) for value in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute_variables(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with every ``$name``, ``${name}``, ``${name:format}`` and ``[[name]]`` replaced.

    ``values`` holds the dashboard variables (as Grafana would render them for PromQL) and may
    override the built-ins in DEFAULT_BUILTINS. An unknown variable raises KeyError: a query
    that Grafana would send with a literal ``$name`` in it.
    """
    merged = {**DEFAULT_BUILTINS, **values}

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3) or match.group(4)
        if name not in merged:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return merged[name]

    return _VARIABLE.sub(replace, expr)


_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?![a-zA-Z0-9_:]|\s*\()")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without", "on", "ignoring",
     "group_left", "group_right"}
)  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (not functions, labels or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range durations
    text = _GROUPING.sub(" ", text)
    return {name for name in _IDENTIFIER.findall(text) if name.lower() not in _KEYWORDS}


def promtool_check(exprs: Sequence[str], promtool: str) -> str:
    """Runs ``promtool check rules`` on the expressions; returns its output ('' when all parse).

    promtool parses rule expressions with the same PromQL parser as the server, so this checks
    syntax and function names offline.
    """
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:expr_{index}", "expr": expr}
                    for index, expr in enumerate(exprs)
                ],
            }
        ]
    }
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "rules.yml"
        path.write_text(yaml.safe_dump(rules, sort_keys=False))
        result = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
        )
    if result.returncode == 0:
        return ""
    return (result.stdout + result.stderr).strip() or f"promtool exited {result.returncode}"


class PrometheusError(RuntimeError):
    """Prometheus answered a query with an error (the message is Prometheus's)."""


class PrometheusServer:
    """A real Prometheus on 127.0.0.1, scraping ``targets`` every ``scrape_interval_s``.

    Use as a context manager; the process and its data directory are removed on exit, also
    when the test fails.
    """

    def __init__(
        self,
        binary: str,
        port: int,
        targets: Mapping[str, Sequence[str]],
        workdir: Path,
        scrape_interval_s: float = 1.0,
    ) -> None:
        self.binary = binary
        self.port = port
        self.targets = dict(targets)
        self.workdir = workdir
        self.scrape_interval_s = scrape_interval_s
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = workdir / "prometheus.log"
        self._process: subprocess.Popen[bytes] | None = None

    def _config(self) -> dict[str, Any]:
        interval = f"{int(self.scrape_interval_s * 1000)}ms"
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {
                    "job_name": job,
                    "honor_labels": True,
                    "static_configs": [{"targets": list(addresses)}],
                }
                for job, addresses in self.targets.items()
            ],
        }

    def start(self, timeout_s: float = 30.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(self._config(), sort_keys=False))
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--enable-feature=exemplar-storage",
                    "--storage.tsdb.retention.time=1h",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"prometheus exited {self._process.returncode}: {self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready after {timeout_s} s: {self.log()}")

    def stop(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        self._process = None

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def log(self, tail_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail_chars:]
        except OSError:
            return ""

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            # Prometheus answers bad queries with 400 and a JSON error body.
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; the result vector (or a one-element list for a scalar)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def query_range(
        self, expr: str, start: float, end: float, step_s: float
    ) -> list[dict[str, Any]]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s}"}
        return list(self._get("/api/v1/query_range", params)["result"])

    def query_exemplars(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}"}
        return list(self._get("/api/v1/query_exemplars", params))

    def series_names(self) -> list[str]:
        return list(self._get("/api/v1/label/__name__/values", {}))

    def active_targets(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/targets", {})["activeTargets"])

    def wait_for(self, expr: str, timeout_s: float, poll_s: float = 1.0) -> list[dict[str, Any]]:
        """Polls ``expr`` until it returns series; returns them, or [] at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expr)
            if result or time.monotonic() >= deadline:
                return result
            time.sleep(poll_s)
