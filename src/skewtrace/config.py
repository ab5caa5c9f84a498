"""Settings of the instrumentation: one dataclass, filled from arguments and ``SKEWTRACE_*``.

Every environment variable is a constant here with its default and meaning, so there is one
place to read them (``docs/configuration.md`` lists the same table for users). Arguments
passed to :func:`skewtrace.instrument` win over environment variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

SKEWTRACE_ENABLED = "SKEWTRACE_ENABLED"
"""``false`` turns :func:`skewtrace.instrument` into a no-op. Default ``true``."""

SKEWTRACE_JOB_ID = "SKEWTRACE_JOB_ID"
"""The job id every rank agrees on. Else ``TORCHELASTIC_RUN_ID``, else ``SLURM_JOB_ID``."""

TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
TORCHELASTIC_UNSET = "none"
SLURM_JOB_ID = "SLURM_JOB_ID"

SKEWTRACE_BUFFER_EVENTS = "SKEWTRACE_BUFFER_EVENTS"
"""Capacity of the rank's event buffer; when full, new events are dropped and counted."""

SKEWTRACE_EXPORT_INTERVAL_MILLIS = "SKEWTRACE_EXPORT_INTERVAL_MILLIS"
"""How often the background thread turns buffered events into spans and exports them."""

SKEWTRACE_SHUTDOWN_TIMEOUT_MILLIS = "SKEWTRACE_SHUTDOWN_TIMEOUT_MILLIS"
"""Upper bound on the final flush at exit or :func:`skewtrace.uninstrument`."""

SKEWTRACE_PACER_URL = "SKEWTRACE_PACER_URL"
"""Base URL of the pacer (``http://host:port``); unset means no pacing."""

SKEWTRACE_PACER_POLL_INTERVAL_MILLIS = "SKEWTRACE_PACER_POLL_INTERVAL_MILLIS"
"""How often the rank's pacing client polls the pacer."""

SKEWTRACE_PACING_MAX_DELAY = "SKEWTRACE_PACING_MAX_DELAY"
"""The rank's own hard cap on one pacing delay, in seconds."""

SKEWTRACE_PACER_TOKEN = "SKEWTRACE_PACER_TOKEN"
"""Bearer token sent to the pacer."""

OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"
OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"

DEFAULT_BUFFER_EVENTS = 65536
DEFAULT_EXPORT_INTERVAL_MILLIS = 500
DEFAULT_SHUTDOWN_TIMEOUT_MILLIS = 5000
DEFAULT_PACER_POLL_INTERVAL_MILLIS = 1000
DEFAULT_PACING_MAX_DELAY = 0.05

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message names the setting."""


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r}: expected true or false")


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected an integer") from None


def _parse_float(name: str, raw: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a number") from None


@dataclass(frozen=True)
class Settings:
    """What the instrumentation does; see ``docs/configuration.md``."""

    enabled: bool = True
    """False makes ``instrument()`` a no-op (``SKEWTRACE_ENABLED``, ``OTEL_SDK_DISABLED``)."""

    job_id: str | None = None
    """Explicit job id; ``None`` means resolve it from the environment (see ``resolve_job_id``)."""

    buffer_events: int = DEFAULT_BUFFER_EVENTS
    """Events the rank buffers before dropping; bounds the instrumentation's memory."""

    export_interval_millis: int = DEFAULT_EXPORT_INTERVAL_MILLIS
    """Period of the background materialize-and-export loop."""

    shutdown_timeout_millis: int = DEFAULT_SHUTDOWN_TIMEOUT_MILLIS
    """Bound on the final flush."""

    pacer_url: str | None = None
    """Pacer base URL; ``None`` disables pacing."""

    pacer_poll_interval_millis: int = DEFAULT_PACER_POLL_INTERVAL_MILLIS
    """Pacing client poll period."""

    pacing_max_delay: float = DEFAULT_PACING_MAX_DELAY
    """Hard cap on one pacing delay, seconds."""

    pacer_token: str | None = field(default=None, repr=False)
    """Bearer token for the pacer (kept out of ``repr`` so it does not reach logs)."""

    def __post_init__(self) -> None:
        if self.buffer_events < 1:
            raise ConfigError(f"buffer_events ({SKEWTRACE_BUFFER_EVENTS}) must be >= 1")
        if self.export_interval_millis < 1:
            raise ConfigError(
                f"export_interval_millis ({SKEWTRACE_EXPORT_INTERVAL_MILLIS}) must be >= 1"
            )
        if self.shutdown_timeout_millis < 0:
            raise ConfigError(
                f"shutdown_timeout_millis ({SKEWTRACE_SHUTDOWN_TIMEOUT_MILLIS}) must be >= 0"
            )
        if self.pacer_poll_interval_millis < 1:
            raise ConfigError(
                f"pacer_poll_interval_millis ({SKEWTRACE_PACER_POLL_INTERVAL_MILLIS}) must be >= 1"
            )
        if not self.pacing_max_delay >= 0:
            raise ConfigError(f"pacing_max_delay ({SKEWTRACE_PACING_MAX_DELAY}) must be >= 0")
        if self.job_id is not None and not self.job_id.strip():
            raise ConfigError("job_id must not be empty")
        if self.pacer_url is not None and not self.pacer_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"pacer_url ({SKEWTRACE_PACER_URL})={self.pacer_url!r}: expected http(s)://host:port"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Settings from ``SKEWTRACE_*`` variables; keyword overrides that are not None win."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        enabled = True
        if SKEWTRACE_ENABLED in env:
            enabled = _parse_bool(SKEWTRACE_ENABLED, env[SKEWTRACE_ENABLED])
        if OTEL_SDK_DISABLED in env and _parse_bool(OTEL_SDK_DISABLED, env[OTEL_SDK_DISABLED]):
            enabled = False
        values["enabled"] = enabled
        if env.get(SKEWTRACE_JOB_ID, "").strip():
            values["job_id"] = env[SKEWTRACE_JOB_ID].strip()
        ints = {
            "buffer_events": SKEWTRACE_BUFFER_EVENTS,
            "export_interval_millis": SKEWTRACE_EXPORT_INTERVAL_MILLIS,
            "shutdown_timeout_millis": SKEWTRACE_SHUTDOWN_TIMEOUT_MILLIS,
            "pacer_poll_interval_millis": SKEWTRACE_PACER_POLL_INTERVAL_MILLIS,
        }
        for attr, name in ints.items():
            if env.get(name, "").strip():
                values[attr] = _parse_int(name, env[name])
        if env.get(SKEWTRACE_PACING_MAX_DELAY, "").strip():
            values["pacing_max_delay"] = _parse_float(
                SKEWTRACE_PACING_MAX_DELAY, env[SKEWTRACE_PACING_MAX_DELAY]
            )
        if env.get(SKEWTRACE_PACER_URL, "").strip():
            values["pacer_url"] = env[SKEWTRACE_PACER_URL].strip()
        if env.get(SKEWTRACE_PACER_TOKEN, ""):
            values["pacer_token"] = env[SKEWTRACE_PACER_TOKEN]
        known = {f.name for f in fields(cls)}
        for key, value in overrides.items():
            if key not in known:
                raise TypeError(f"unknown setting {key!r}")
            if value is not None:
                values[key] = value
        return cls(**values)  # type: ignore[arg-type]

    def with_job_id(self, job_id: str) -> Settings:
        return replace(self, job_id=job_id)


def resolve_job_id(
    explicit: str | None, world_size: int, env: Mapping[str, str] | None = None
) -> str:
    """The job id: argument, then SKEWTRACE_JOB_ID, TORCHELASTIC_RUN_ID, SLURM_JOB_ID.

    With none of them and more than one rank there is no id every rank would pick the same
    way (a random one differs per rank and splits each step into one trace per rank), so
    that is an error; a single rank gets a generated id.
    """
    env = os.environ if env is None else env
    if explicit is not None and explicit.strip():
        return explicit.strip()
    for name in (SKEWTRACE_JOB_ID, TORCHELASTIC_RUN_ID, SLURM_JOB_ID):
        value = env.get(name, "").strip()
        # torchrun sets TORCHELASTIC_RUN_ID=none without --rdzv-id: every such job would
        # share one id, and their traces would mix.
        if name == TORCHELASTIC_RUN_ID and value == TORCHELASTIC_UNSET:
            continue
        if value:
            return value
    if world_size > 1:
        raise ConfigError(
            f"no job id: pass job_id= or set {SKEWTRACE_JOB_ID} (or run under torchrun with "
            f"--rdzv-id, or Slurm, which set {TORCHELASTIC_RUN_ID}/{SLURM_JOB_ID}); with "
            f"{world_size} ranks a "
            "generated id could differ between ranks and break the per-step traces"
        )
    return "local-" + os.urandom(6).hex()
