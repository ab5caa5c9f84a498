"""What ``skewtrace pacer`` can be told: :class:`PacerConfig`, the service's settings, checked
when made.

Its fields are the command's flags (:mod:`skewtrace.cli`, through :mod:`skewtrace._options`),
with each field's docstring as its help; each registered policy's parameters
(:data:`~skewtrace.controller.policies.POLICIES`) are completed and checked here too. Imports
no server: the command line reads it without grpc or the OTel SDK.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from skewtrace._options import (
    FieldError,
    HostPort,
    address,
    at_least,
    check_fields,
    integer,
    not_blank,
    option,
    positive,
    text,
)
from skewtrace.controller.policies import (
    check_params,
    complete_params,
    job_policies,
    job_policy_entries,
    known_job_policies,
    known_policies,
    policy_names,
)

P = TypeVar("P")


@dataclass(frozen=True)
class PacerConfig:
    """Everything ``skewtrace pacer`` can be told; see ``docs/pacing.md``.

    Every field but ``policy_params`` is a ``skewtrace pacer`` flag (``skewtrace.cli``), and
    so is every field of each registered policy's parameters
    (:data:`~skewtrace.controller.policies.POLICIES`); the docstrings are their help.
    """

    policy_names: str = option("pacing", parse=policy_names, check=known_policies, name="policy")
    """Controller policies for every job, comma-separated; several are composed (see
    docs/pacing.md, 'Policies')."""

    job_policies: str | None = option(
        None, parse=job_policies, check=known_job_policies, name="job_policy"
    )
    """Other policies for the jobs whose ids match a pattern: PATTERN=NAME[,NAME]
    entries separated by ';' (shell-style patterns, the first match wins; a job no pattern
    matches gets ``policy_names``), e.g. one pacer for several arms of an experiment."""

    otlp_grpc: HostPort = option(HostPort("127.0.0.1", 4321), parse=HostPort.parse, check=address)
    """Where the Collector pushes OTLP/gRPC metrics (port 0: any free port)."""

    http: HostPort = option(HostPort("127.0.0.1", 4320), parse=HostPort.parse, check=address)
    """Where ranks GET /v1/pacing?job=ID (port 0: any free port)."""

    token: str | None = option(None, parse=text, check=not_blank, secret=True)
    """Bearer token required on /v1/* (/healthz stays open) and on OTLP/gRPC (the
    authorization metadata); none serves both without one."""

    otlp_tls_cert_file: str | None = option(None, parse=text, check=not_blank)
    """PEM certificate (chain) the OTLP/gRPC receiver serves TLS with; none: plaintext."""

    otlp_tls_key_file: str | None = option(None, parse=text, check=not_blank)
    """PEM private key of ``otlp_tls_cert_file``."""

    otlp_tls_client_ca_file: str | None = option(None, parse=text, check=not_blank)
    """PEM CA bundle: OTLP/gRPC clients must present a certificate it signed (mTLS)."""

    http_read_timeout_s: float = option(10.0, check=positive, seconds=True)
    """An HTTP connection that has not sent a whole request this long after it opened (or
    after its previous answer) is closed."""

    http_max_connections: int = option(256, parse=integer, check=at_least(1))
    """HTTP connections served at once (a thread each); more are answered 503 and closed."""

    window_s: float = option(4.0, check=positive, seconds=True, deprecated=["window_s"])
    """How far back each decision looks at the metrics received."""

    window_steps: int = option(4, parse=integer, check=at_least(1))
    """A job's window (and rank timeout) stretches past ``window_s`` to hold at least this
    many of its steps (its period: the larger of its step duration and the time between its
    steps' arrivals): a job whose steps take longer than ``window_s / min_steps`` would
    otherwise never be judged."""

    max_window_s: float = option(60.0, check=positive, seconds=True)
    """The longest a stretched window gets (jobs with longer steps are judged on fewer)."""

    decision_interval_s: float = option(
        0.5, check=positive, seconds=True, deprecated=["decision_interval_s"]
    )
    """How often every job's decision is recomputed."""

    rank_timeout_s: float = option(4.0, check=positive, seconds=True, deprecated=["rank_timeout_s"])
    """A rank with no new steps for this long is left out of its job's decisions."""

    job_timeout_s: float = option(60.0, check=positive, seconds=True, deprecated=["job_timeout_s"])
    """A job with no data points for this long is forgotten."""

    max_jobs: int = option(1024, parse=integer, check=at_least(1))
    """Jobs tracked at once; data points of further jobs are dropped and counted."""

    max_ranks_per_job: int = option(65536, parse=integer, check=at_least(2))
    """Ranks tracked per job; data points of further ranks are dropped and counted."""

    max_series_per_job: int = option(262144, parse=integer, check=at_least(3))
    """Series (metric, rank and attribute set) tracked per job; data points of further series
    are dropped and counted."""

    max_series: int = option(1048576, parse=integer, check=at_least(3))
    """Series tracked in all jobs together; likewise."""

    policy_params: tuple[Any, ...] = ()
    """Every registered policy's parameters, in registry order (an instance of each one's
    ``params_type``); those not given are completed with their defaults."""

    metrics_endpoint: str | None = option(None, parse=text, check=not_blank)
    """OTLP/gRPC endpoint for the pacer's own metrics; none keeps them in the process."""

    metrics_interval_s: float = option(
        5.0, check=positive, seconds=True, deprecated=["metrics_interval_s"]
    )
    """Export period of the pacer's own metrics."""

    def __post_init__(self) -> None:
        check_fields(self)
        object.__setattr__(self, "policy_params", complete_params(self.policy_params))
        check_params(self.policy_names, self.policy_params, self)
        for _, names in job_policy_entries(self.job_policies):
            check_params(names, self.policy_params, self)
        if not self.max_window_s >= self.window_s:
            raise FieldError("max_window_s", "must be at least {0}", "window_s")
        if (self.otlp_tls_cert_file is None) != (self.otlp_tls_key_file is None):
            missing, given = (
                ("otlp_tls_key_file", "otlp_tls_cert_file")
                if self.otlp_tls_key_file is None
                else ("otlp_tls_cert_file", "otlp_tls_key_file")
            )
            raise FieldError(missing, "must be set with {0}", given)
        if self.otlp_tls_client_ca_file is not None and self.otlp_tls_cert_file is None:
            raise FieldError(
                "otlp_tls_client_ca_file",
                "needs {0} and {1}",
                "otlp_tls_cert_file",
                "otlp_tls_key_file",
            )

    def params_for(self, params_type: type[P]) -> P:
        """The parameters of the registered policy whose ``params_type`` this is."""
        for params in self.policy_params:
            if type(params) is params_type:
                found: P = params
                return found
        raise KeyError(params_type.__name__)
