"""The controller service behind ``skewtrace pacer``: OTLP metrics in, a decision per job on
every tick, decisions served over HTTP.

::

    Collector (barrierskew connector -> otlp exporter)
        | OTLP/gRPC ExportMetricsServiceRequest
        v
    OtlpMetricsServer --ingest--> JobWindows (per job, per rank deltas over window_s)
                                       | every decision_interval_s: expire, window(), decide()
                                       v
                                  decisions[job] --> PacingHttpServer  GET /v1/pacing?job=ID
                                       |             (a DecisionBody: delays, and shares with
                                       |              --policy rebalance)
                                       |
                                       +--> own metrics (skewtrace.pacing.*) via the OTel SDK

One lock guards the windows and the decisions; the gRPC and HTTP threads hold it only to copy
in or read out, the ticker to run the policy (microseconds per job).

Both inputs are authenticated with the same ``token`` when one is set (``docs/security.md``);
what either server refuses, and every data point dropped, is counted by reason at ``/healthz``
and in the pacer's own metrics. Log lines that carry client-supplied text (job ids) go
through one :class:`~skewtrace.controller._limits.LogBudget`.

This module is the wiring; what it wires is elsewhere: the settings
(:class:`~skewtrace.controller.config.PacerConfig`, importable from here too), the windows
(:mod:`~skewtrace.controller.state`), the body a decision is published as
(:mod:`~skewtrace.controller.publish`), the pacer's own metrics
(:mod:`~skewtrace.controller.own_metrics`).
"""

from __future__ import annotations

import fnmatch
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.metrics import MeterProvider

from skewtrace import semconv
from skewtrace._options import HostPort
from skewtrace.controller._auth import grpc_server_credentials
from skewtrace.controller._limits import LogBudget, loggable
from skewtrace.controller.config import PacerConfig
from skewtrace.controller.http_api import REFUSED_REASONS as HTTP_REFUSED_REASONS
from skewtrace.controller.http_api import PacingHttpServer
from skewtrace.controller.otlp_receiver import (
    REFUSED_INGEST_FAILED,
    REFUSED_UNAUTHENTICATED,
    REFUSED_UNDECODABLE,
    ExportRequest,
    OtlpMetricsServer,
)
from skewtrace.controller.otlp_receiver import REFUSED_REASONS as OTLP_REFUSED_REASONS
from skewtrace.controller.own_metrics import build_meter_provider, register_instruments
from skewtrace.controller.policies import build_policy, job_policy_entries
from skewtrace.controller.policies.base import ControllerPolicy, Outcome
from skewtrace.controller.publish import PublishedDecision, publish
from skewtrace.controller.state import JobWindows
from skewtrace.decision import DecisionBody

_log = logging.getLogger(__name__)


class PacerService:
    """Owns the servers, the windows, the policy loop and the pacer's own metrics."""

    def __init__(
        self,
        config: PacerConfig,
        *,
        meter_provider: MeterProvider | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._windows = JobWindows(
            config.window_s,
            config.job_timeout_s,
            rank_timeout_s=config.rank_timeout_s,
            max_jobs=config.max_jobs,
            max_ranks_per_job=config.max_ranks_per_job,
            max_series_per_job=config.max_series_per_job,
            max_series=config.max_series,
            window_steps=config.window_steps,
            max_window_s=config.max_window_s,
        )
        self._log_budget = LogBudget(clock=clock)
        self._policy: ControllerPolicy = build_policy(config.policy_names, config.policy_params)
        self._job_policies = [
            (pattern, build_policy(names, config.policy_params))
            for pattern, names in job_policy_entries(config.job_policies)
        ]
        self._policy_of: dict[str, ControllerPolicy] = {}
        self._decisions: dict[str, PublishedDecision] = {}
        self._requests = 0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._otlp: OtlpMetricsServer | None = None
        self._http: PacingHttpServer | None = None
        self._owned_meter_provider: Any = None
        self._setup_metrics(meter_provider)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Bind both servers and start the decision loop; raises OSError when a port is taken."""
        cfg = self.config
        credentials = None
        if cfg.otlp_tls_cert_file and cfg.otlp_tls_key_file:
            credentials = grpc_server_credentials(
                cfg.otlp_tls_cert_file, cfg.otlp_tls_key_file, cfg.otlp_tls_client_ca_file
            )
        self._otlp = OtlpMetricsServer(
            cfg.otlp_grpc.host,
            cfg.otlp_grpc.port,
            self.ingest,
            token=cfg.token,
            credentials=credentials,
            log_budget=self._log_budget,
        )
        try:
            self._http = PacingHttpServer(
                cfg.http.host,
                cfg.http.port,
                self.decision_body,
                jobs=self.job_ids,
                health=self.health,
                token=cfg.token,
                read_timeout_s=cfg.http_read_timeout_s,
                max_connections=cfg.http_max_connections,
                log_budget=self._log_budget,
                step_start=self.note_step_start,
            )
        except OSError:
            self._otlp.stop(0)
            raise
        self._otlp.start()
        self._http.start()
        self._ticker = threading.Thread(target=self._run_ticks, name="pacer-decide", daemon=True)
        self._ticker.start()
        otlp_security = [
            "mTLS" if cfg.otlp_tls_client_ca_file else "TLS" if credentials else "",
            "bearer token" if cfg.token else "",
        ]
        _log.info(
            "pacer listening: OTLP/gRPC metrics on %s (%s), decisions on http://%s (%s)",
            HostPort(cfg.otlp_grpc.host, self.otlp_port),
            " + ".join(p for p in otlp_security if p) or "no authentication",
            HostPort(cfg.http.host, self.http_port),
            "bearer token" if cfg.token else "no authentication",
        )

    @property
    def otlp_port(self) -> int:
        return self._otlp.port if self._otlp else self.config.otlp_grpc.port

    @property
    def http_port(self) -> int:
        return self._http.port if self._http else self.config.http.port

    def stop(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        if self._http is not None:
            self._http.stop()
        if self._otlp is not None:
            self._otlp.stop()
        if self._owned_meter_provider is not None:
            # Bounded: an unreachable metrics endpoint must not hold up shutdown.
            self._owned_meter_provider.shutdown(timeout_millis=2000)

    def wait(self) -> None:
        """Block until :meth:`stop` (from a signal handler) is called."""
        while not self._stop.wait(1.0):
            pass

    def _run_ticks(self) -> None:
        while not self._stop.wait(self.config.decision_interval_s):
            try:
                self.tick()
            except Exception:
                self._log_budget.log(
                    _log,
                    logging.ERROR,
                    "pacer decision tick failed; keeping the previous decisions",
                    exc_info=True,
                )

    # ------------------------------------------------------------------ data path

    def ingest(self, request: ExportRequest) -> int:
        now = self._clock()
        with self._lock:
            self._requests += 1
            return self._windows.ingest_request(request.resource_metrics, now)

    def tick(self, now: float | None = None) -> None:
        """Expire old data and recompute every job's decision (the loop calls this)."""
        now = self._clock() if now is None else now
        decided: list[str] = []
        with self._lock:
            for job_id in self._windows.expire(now):
                self._decisions.pop(job_id, None)
                self._policy_of.pop(job_id, None)
                self._log_budget.log(
                    _log,
                    logging.INFO,
                    "forgot job %s: no metrics for %.0f s",
                    loggable(job_id),
                    self.config.job_timeout_s,
                )
            for job_id in self._windows.job_ids():
                previous = self._decisions.get(job_id)
                window = self._windows.window(job_id, now)
                policy = self._policy_for(job_id)
                state = previous.state if previous else policy.initial_state()
                decision = policy.decide(window, state)
                published = publish(job_id, policy.name, decision, previous, self._wall_clock)
                self._decisions[job_id] = published
                self._log_published(job_id, decision, previous, published)
                self._windows.record_decision(
                    job_id,
                    now,
                    decision.delays,
                    scheduled=published.body.active and published.body.schedule is not None,
                    offsets=published.body.offsets if published.body.active else None,
                )
                decided.append(job_id)
        for job_id in decided:
            self._decisions_counter.add(1, {semconv.JOB_ID: job_id})

    def _policy_for(self, job_id: str) -> ControllerPolicy:
        """The policy deciding for ``job_id``: its ``--job-policy`` entry's (the first whose
        pattern matches), else ``--policy``'s; kept until the job is forgotten."""
        found = self._policy_of.get(job_id)
        if found is None:
            found = next(
                (p for pattern, p in self._job_policies if fnmatch.fnmatchcase(job_id, pattern)),
                self._policy,
            )
            self._policy_of[job_id] = found
        return found

    def _log_published(
        self,
        job_id: str,
        decision: Outcome,
        previous: PublishedDecision | None,
        published: PublishedDecision,
    ) -> None:
        """Log a job's pacing turned on or off, its new shares, and its batches' new split."""
        if previous is None or previous.body.active != decision.active:
            self._log_budget.log(
                _log,
                logging.INFO,
                "job %s: pacing %s (%s; spread %.3f of step time)",
                loggable(job_id),
                "on" if decision.active else "off",
                decision.reason,
                decision.spread or 0.0,
            )
        if decision.balance is not None and published.balance_version != (
            previous.balance_version if previous else 0
        ):
            self._log_budget.log(
                _log,
                logging.INFO,
                "job %s: each global batch split by %s (balance version %d; %s)",
                loggable(job_id),
                decision.balance,
                published.balance_version,
                decision.reason,
            )
        shares = published.body.shares or {}
        if decision.shares is not None and published.shares_version != (
            previous.shares_version if previous else 0
        ):
            self._log_budget.log(
                _log,
                logging.INFO,
                "job %s: shares version %d over %d ranks, %.4f..%.4f",
                loggable(job_id),
                published.shares_version,
                len(shares),
                min(shares.values(), default=0.0),
                max(shares.values(), default=0.0),
            )

    # ------------------------------------------------------------------ read side

    def decision_body(self, job_id: str) -> Mapping[str, Any] | None:
        with self._lock:
            found = self._decisions.get(job_id)
            if found is None:
                return None
            body = dict(found.json)
        if found.body.schedule is not None:
            # The clock the ranks hold to: each estimates its offset to it from this.
            body.pop("body_version", None)
            body["served_unix"] = self._wall_clock()
            body["body_version"] = found.body.body_version
        return body

    def note_step_start(self, job_id: str, raw_age: str) -> bool:
        """A rank's report, with its poll, of how long before it one of its steps started
        (see :meth:`JobWindows.note_step_start`)."""
        wall_now, now = self._wall_clock(), self._clock()
        with self._lock:
            return self._windows.note_step_start(job_id, raw_age, wall_now, now)

    def job_ids(self) -> list[str]:
        with self._lock:
            return list(self._decisions)

    def health(self) -> dict[str, Any]:
        with self._lock:
            counters = self._windows.counters.as_dict()
            jobs = len(self._decisions)
            series = self._windows.series
            requests = self._requests
        otlp_refused = self.otlp_refused()
        http_refused = self.http_refused()
        return {
            "jobs": jobs,
            "series": series,
            "otlp_requests": requests,
            "otlp_requests_unauthenticated": otlp_refused[REFUSED_UNAUTHENTICATED],
            "otlp_requests_undecodable": otlp_refused[REFUSED_UNDECODABLE],
            "otlp_requests_failed": otlp_refused[REFUSED_INGEST_FAILED],
            **counters,
            "http_connections": self._http.connections if self._http else 0,
            **{f"http_refused_{reason}": n for reason, n in http_refused.items()},
        }

    def otlp_refused(self) -> dict[str, int]:
        """OTLP requests refused, by reason (none reached the windows)."""
        if self._otlp is None:
            return dict.fromkeys(OTLP_REFUSED_REASONS, 0)
        return self._otlp.receiver.refused.snapshot()

    def http_refused(self) -> dict[str, int]:
        """HTTP requests and connections refused or closed early, by reason."""
        if self._http is None:
            return dict.fromkeys(HTTP_REFUSED_REASONS, 0)
        return self._http.refused.snapshot()

    def points_rejected(self) -> dict[str, int]:
        """Data points dropped, by reason."""
        with self._lock:
            return self._windows.counters.rejected()

    def _decisions_snapshot(self) -> dict[str, DecisionBody]:
        with self._lock:
            return {job: d.body for job, d in self._decisions.items()}

    # ------------------------------------------------------------------ own metrics

    def _setup_metrics(self, meter_provider: MeterProvider | None) -> None:
        if meter_provider is None:
            meter_provider = self._owned_meter_provider = build_meter_provider(self.config)
        self._decisions_counter = register_instruments(
            meter_provider.get_meter("skewtrace.pacer"),
            self._decisions_snapshot,
            # The same numbers as /healthz, read when the metrics are collected.
            (
                (semconv.METRIC_PACER_OTLP_REFUSED, self.otlp_refused),
                (semconv.METRIC_PACER_POINTS_REJECTED, self.points_rejected),
                (semconv.METRIC_PACER_HTTP_REFUSED, self.http_refused),
            ),
        )
