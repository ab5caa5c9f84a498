"""Series from the Prometheus HTTP API (``/api/v1/query_range``), standard library only.

Every query selects the job by its label (``training_job_id``, from
``semconv.prometheus_label(semconv.JOB_ID)``) and a metric by its ``semconv.PROM_*`` name.
Counters are read as ``rate(metric[W])``, histograms as ``rate(_sum[W]) / rate(_count[W])``.

Resolution: the query step is the scrape interval (read once from ``/api/v1/status/config``;
15 s when Prometheus does not say), or coarser so that a range has at most
:data:`MAX_POINTS` samples. The rate window ``W`` is four steps (four scrapes at least, so
``rate()`` always has two samples).

Failures raise :class:`PrometheusError` (a :class:`~.source.TimelineError`) naming the URL
and what went wrong: not reachable, an HTTP error, or Prometheus's own error message.
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import yaml

from skewtrace import semconv
from skewtrace.timeline.source import Form, Query, Series, TimelineError

JOB_LABEL = semconv.prometheus_label(semconv.JOB_ID)
DEFAULT_SCRAPE_INTERVAL_S = 15.0
MAX_POINTS = 1000
RATE_WINDOW_STEPS = 4

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class PrometheusError(TimelineError):
    """Prometheus could not be asked, or answered with an error."""

    def __init__(self, url: str, message: str, kind: str = "error") -> None:
        super().__init__(f"Prometheus at {url}: {message}")
        self.url = url
        self.message = message
        self.kind = kind
        """``unreachable``, ``http``, ``response`` (not JSON) or ``error`` (Prometheus's own)."""


def prometheus_duration_s(text: str) -> float:
    """Seconds of a Prometheus duration (``1m30s``, ``15s``, ``500ms``)."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


def _quote(value: str) -> str:
    return json.dumps(value)  # a PromQL string literal has the same escapes as JSON


def _selector(metric: str, job: str, labels: tuple[tuple[str, str], ...]) -> str:
    matchers = [f"{JOB_LABEL}={_quote(job)}"]
    matchers += [f"{key}={_quote(value)}" for key, value in labels]
    return f"{metric}{{{', '.join(matchers)}}}"


def promql(query: Query, job: str, rate_window_s: float) -> str:
    """The PromQL expression for one query."""
    window = f"{max(1, round(rate_window_s * 1000))}ms"

    def rate(metric: str) -> str:
        return f"rate({_selector(metric, job, query.labels)}[{window}])"

    if query.form is Form.GAUGE or query.form is Form.RAW:
        return _selector(query.metric, job, query.labels)
    if query.form is Form.RATE:
        return rate(query.metric)
    if query.form is Form.MEAN:
        return f"{rate(query.metric + '_sum')} / {rate(query.metric + '_count')}"
    if query.denominator is None:
        raise ValueError(f"{query.metric}: a ratio needs a denominator")
    return f"{rate(query.metric)} / {rate(query.denominator)}"


class PrometheusSource:
    """Reads series for the timeline from one Prometheus server."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        step_s: float | None = None,
        rate_window_s: float | None = None,
    ) -> None:
        """``step_s`` and ``rate_window_s`` override the resolution chosen from the scrape
        interval."""
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._step_s = step_s
        self._rate_window_s = rate_window_s
        self._scrape_interval_s: float | None = None

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            # Prometheus answers a bad query with 4xx and a JSON error body.
            try:
                body = json.loads(exc.read() or b"{}")
            except ValueError:
                body = {}
            if body.get("status") != "error":
                raise PrometheusError(
                    self.url, f"HTTP {exc.code} {exc.reason} for {path}", "http"
                ) from None
        except urllib.error.URLError as exc:
            raise PrometheusError(
                self.url, f"not reachable ({exc.reason})", "unreachable"
            ) from None
        except (TimeoutError, OSError) as exc:
            raise PrometheusError(self.url, f"not reachable ({exc})", "unreachable") from None
        except ValueError:
            raise PrometheusError(
                self.url, f"{path} answered something that is not JSON", "response"
            ) from None
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else None
            kind = body.get("errorType") if isinstance(body, dict) else None
            detail = str(error) if error else f"unexpected answer {body!r:.200}"
            raise PrometheusError(self.url, f"{kind or 'error'}: {detail}")
        return body.get("data")

    def scrape_interval_s(self) -> float:
        """The global scrape interval of the server's configuration (cached)."""
        if self._scrape_interval_s is None:
            interval = DEFAULT_SCRAPE_INTERVAL_S
            data = self._get("/api/v1/status/config", {})
            try:
                config = yaml.safe_load(data.get("yaml", "")) or {}
                interval = prometheus_duration_s(str(config["global"]["scrape_interval"]))
            except (AttributeError, KeyError, TypeError, ValueError, yaml.YAMLError):
                pass  # a server that hides its config: the common default
            self._scrape_interval_s = interval
        return self._scrape_interval_s

    def resolution(self, start: float, end: float) -> float:
        if self._step_s is not None:
            return self._step_s
        return max(self.scrape_interval_s(), (end - start) / MAX_POINTS)

    def rate_window_s(self, start: float, end: float) -> float:
        if self._rate_window_s is not None:
            return self._rate_window_s
        return RATE_WINDOW_STEPS * max(self.resolution(start, end), self.scrape_interval_s())

    def smear_s(self, query: Query, start: float, end: float) -> float:
        if query.form in (Form.GAUGE, Form.RAW):
            return 0.0
        return self.rate_window_s(start, end)

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[Series]:
        data = self._get(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"},
        )
        found = []
        for item in data.get("result", []):
            times, values = [], []
            for stamp, text in item.get("values", []):
                value = float(text)  # "NaN", "+Inf" parse; the detector skips them
                if math.isfinite(value):
                    times.append(float(stamp))
                    values.append(value)
            labels = {k: str(v) for k, v in item.get("metric", {}).items() if k != "__name__"}
            found.append(Series(labels, times, values))
        return found

    def series(self, query: Query, job: str, start: float, end: float) -> list[Series]:
        step = self.resolution(start, end)
        expr = promql(query, job, self.rate_window_s(start, end))
        return self.query_range(expr, start, end, step)
