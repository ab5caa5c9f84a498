"""Settings of the instrumentation: one dataclass, filled from arguments and ``SKEWTRACE_*``.

Each field of :class:`Settings` is read from the variable ``SKEWTRACE_<FIELD>`` (a field
holding seconds, ``_s``, from ``SKEWTRACE_<NAME>_MILLIS`` in milliseconds; see
:mod:`skewtrace._options`), and the docstring under it says what it does; ``docs/configuration.md``
lists the same table for users. Arguments passed to :func:`skewtrace.instrument` win over
environment variables. Pacing settings share the pacer's family, ``SKEWTRACE_PACER_*``;
``SKEWTRACE_PACING_MAX_DELAY`` (seconds) still works, with a warning, as
``SKEWTRACE_PACER_RANK_MAX_DELAY_MILLIS``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from skewtrace._options import (
    ConfigError,
    FieldError,
    Given,
    at_least,
    boolean,
    check_fields,
    from_env,
    http_url,
    integer,
    non_negative,
    not_blank,
    one_of,
    option,
    settings,
    text,
    word,
)

__all__ = ["ConfigError", "Settings", "env_var", "job_id_from_env", "resolve_job_id"]

ENV_PREFIX = "SKEWTRACE_"

SKEWTRACE_JOB_ID = "SKEWTRACE_JOB_ID"
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
TORCHELASTIC_UNSET = "none"
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
SLURM_JOB_ID = "SLURM_JOB_ID"
OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"

_log = logging.getLogger("skewtrace.config")

MIN_NODE_TELEMETRY_INTERVAL_S = 0.1


def _node_telemetry_interval(value: object) -> str | None:
    """Sampling faster than 10 times a second would cost more than it shows (see
    docs/telemetry.md, Cost)."""
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= MIN_NODE_TELEMETRY_INTERVAL_S
    )
    return (
        None if ok else f"must be at least {MIN_NODE_TELEMETRY_INTERVAL_S * 1000:g} (milliseconds)"
    )


@dataclass(frozen=True)
class Settings:
    """What the instrumentation does; see ``docs/configuration.md``."""

    enabled: bool = option(True, parse=boolean)
    """False makes ``instrument()`` a no-op (so does ``OTEL_SDK_DISABLED=true``)."""

    job_id: str | None = option(None, parse=text, check=not_blank)
    """The job id every rank agrees on; ``None`` means resolve it from the environment
    (``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID``; see :func:`job_id_from_env`), else agree on
    a generated one through the default process group's store (:mod:`skewtrace.rank._job_id`)."""

    job_id_timeout_millis: int = option(300_000, parse=integer, check=at_least(1))
    """How long a rank waits for rank 0's generated job id in the process group's store
    (counted from when it first sees the process group) before it gives up: its spans are
    then dropped and counted (``reason=no_job_id``). The wait never blocks training; spans
    recorded meanwhile are held in the event buffer."""

    buffer_events: int = option(65536, parse=integer, check=at_least(1))
    """Capacity of the rank's event buffer; when full, new events are dropped and counted.
    Bounds the instrumentation's memory."""

    export_interval_millis: int = option(500, parse=integer, check=at_least(1))
    """How often the background thread turns buffered events into spans and exports them."""

    shutdown_timeout_millis: int = option(5000, parse=integer, check=at_least(0))
    """Upper bound on the final flush at exit or :func:`skewtrace.uninstrument`."""

    pacer_url: str | None = option(None, parse=text, check=http_url)
    """Base URL of the pacer (``http://host:port``); ``None`` means no pacing."""

    pacer_poll_interval_millis: int = option(1000, parse=integer, check=at_least(1))
    """How often the rank's pacing client polls the pacer."""

    pacer_rank_max_delay_s: float = option(
        0.05, check=non_negative, seconds=True, deprecated=["pacing_max_delay"]
    )
    """The rank's own hard cap on one pacing delay, whatever the pacer says."""

    pacer_token: str | None = option(None, parse=text, check=not_blank, secret=True)
    """Bearer token sent to the pacer (kept out of ``repr`` so it does not reach logs)."""

    node_telemetry: bool = option(True, parse=boolean)
    """Node telemetry as OTel metrics (interfaces, RDMA ports, qdiscs, disks, TCP
    retransmits from local rank 0; the rank's GPU, process I/O and data-loader wait from every
    rank); see ``docs/telemetry.md``."""

    node_telemetry_interval_s: float = option(1.0, check=_node_telemetry_interval, seconds=True)
    """How often node telemetry is sampled and exported (with a MeterProvider of the user's,
    its readers' schedule applies instead)."""

    node_telemetry_root: str = option("/", parse=text, check=not_blank)
    """The directory ``proc/`` and ``sys/`` are read under (a fake tree in tests)."""

    collective_hooks: str = option("auto", parse=word, check=one_of("auto", "functions"))
    """Where collectives are seen: ``auto`` hooks every process group (PyTorch 2.15 and
    later: every API, functional collectives included) and falls back to wrapping the
    ``torch.distributed`` functions on older PyTorch; ``functions`` always wraps the
    functions (DDP buckets and ``torch.distributed`` calls only)."""

    collectives: str = option("auto", parse=word, check=one_of("auto", "flight_recorder", "hooks"))
    """Where collective spans come from. ``flight_recorder``: read from c10d's Flight Recorder
    on a thread of skewtrace's own, for every group whose backends record to it (gloo, NCCL);
    no Python hook runs per collective on those groups. ``hooks``: the Python hooks
    (``SKEWTRACE_COLLECTIVE_HOOKS`` says which). ``auto``: the Flight Recorder for groups whose
    backends also record each collective's device duration (NCCL with
    ``TORCH_NCCL_ENABLE_TIMING=1``), the hooks elsewhere (gloo records no completion, so its
    spans would end when skewtrace polled them). A PyTorch
    without the Flight Recorder API falls back to the hooks, logged once. Point-to-point stays
    on the hooks (``docs/performance.md``)."""

    flight_recorder_interval_millis: int = option(50, parse=integer, check=at_least(1))
    """How often the Flight Recorder is read (``SKEWTRACE_COLLECTIVES``). A read costs a few
    microseconds when nothing is new, and otherwise about 15-20 us per entry of the ring
    (``TORCH_FR_BUFFER_SIZE``) with the GIL held; on gloo the span ends up to this late."""

    layer_profile_every: int = option(50, parse=integer, check=at_least(0))
    """On a pipeline stage (a rank that sends or receives point-to-point messages), every
    this many steps the forward and backward of each layer (child module) of the model are
    timed for one step and sent as a ``pipeline.layers`` span: what the Collector proposes a
    stage partition from. 0 turns it off. The sampled step costs a few hooks per layer and
    micro-batch (and, on CUDA, a synchronize around each); the others cost one comparison per
    forward (``docs/performance.md``)."""

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Settings from ``SKEWTRACE_*`` variables; keyword overrides that are not None win."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        given: dict[str, Given] = {}
        for setting in settings(cls):
            found = from_env(setting, env, ENV_PREFIX)
            if found is None:
                continue
            try:
                values[setting.field] = setting.value(found.raw, deprecated=found.deprecated)
            except ValueError as exc:
                raise ConfigError(f"{found.source}={found.raw!r}: {exc}") from None
            given[setting.field] = found
        if sdk_disabled(env):
            values["enabled"] = False
        known = {f.name for f in fields(cls)}
        for key, value in overrides.items():
            if key not in known:
                raise TypeError(f"unknown setting {key!r}")
            if value is not None:
                values[key] = value
                given.pop(key, None)
        try:
            return cls(**values)  # type: ignore[arg-type]
        except FieldError as exc:
            bad = given.get(exc.field)
            where = f"{bad.source}={bad.raw!r}:" if bad else f"{exc.field} ({env_var(exc.field)})"
            raise ConfigError(f"{where} {exc.detail()}") from None

    def with_job_id(self, job_id: str) -> Settings:
        return replace(self, job_id=job_id)


def env_var(field_name: str) -> str:
    """The variable a :class:`Settings` field is read from."""
    for setting in settings(Settings):
        if setting.field == field_name:
            return ENV_PREFIX + setting.name.upper()
    raise KeyError(field_name)


def sdk_disabled(env: Mapping[str, str] | None = None) -> bool:
    """``OTEL_SDK_DISABLED`` as the SDK reads it: only ``true`` (any case) disables.

    Any other value leaves the SDK (and skewtrace) on; one that is not ``false`` either is
    warned about, since it was probably meant to disable.
    """
    env = os.environ if env is None else env
    raw = env.get(OTEL_SDK_DISABLED, "")
    value = raw.strip().lower()
    if value == "true":
        return True
    if value not in ("", "false"):
        _log.warning(
            "%s=%r is not 'true': the OpenTelemetry SDK and skewtrace stay enabled",
            OTEL_SDK_DISABLED,
            raw,
        )
    return False


def job_id_from_env(explicit: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The job id given by the user or the launcher, None when there is none.

    In this order: ``explicit`` (the argument), ``SKEWTRACE_JOB_ID``, ``TORCHELASTIC_RUN_ID``
    (unless ``none``), ``SLURM_JOB_ID``. Under an elastic restart (torchrun's
    ``TORCHELASTIC_RESTART_COUNT`` above 0) the id gets ``-attempt<N>``: the restarted worker
    group counts its steps and each group's collectives from 0 again, and under the same id
    the Collector would take them for steps it has already analysed.
    """
    env = os.environ if env is None else env
    found = _given_job_id(explicit, env)
    if found is None:
        return None
    attempt = restart_attempt(env)
    return f"{found}-attempt{attempt}" if attempt else found


def _given_job_id(explicit: str | None, env: Mapping[str, str]) -> str | None:
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
    return None


def restart_attempt(env: Mapping[str, str] | None = None) -> int:
    """torchrun's restart count of this worker group (0: the first attempt, or no torchrun;
    a value that is not a count is taken as 0)."""
    env = os.environ if env is None else env
    try:
        return max(0, int(env.get(TORCHELASTIC_RESTART_COUNT, "0").strip() or 0))
    except ValueError:
        return 0


def generated_job_id(prefix: str = "local") -> str:
    return f"{prefix}-{os.urandom(6).hex()}"


def resolve_job_id(
    explicit: str | None, world_size: int, env: Mapping[str, str] | None = None
) -> str:
    """The job id without a process group: :func:`job_id_from_env`, else a generated one for
    a single rank.

    With none of them and more than one rank there is no id every rank would pick the same
    way on its own (a random one differs per rank and splits each step into one trace per
    rank): that is an error here. The instrumentation then agrees on one through the
    default process group's store instead (:mod:`skewtrace.rank._job_id`).
    """
    found = job_id_from_env(explicit, env)
    if found is not None:
        return found
    if world_size > 1:
        raise ConfigError(no_job_id_message(world_size))
    return generated_job_id()


def no_job_id_message(world_size: int) -> str:
    return (
        f"no job id: pass job_id= or set {SKEWTRACE_JOB_ID} (or run under torchrun with "
        f"--rdzv-id, or Slurm, which set {TORCHELASTIC_RUN_ID}/{SLURM_JOB_ID}), or call "
        f"instrument() after init_process_group so that the ranks agree on one through its "
        f"store; with {world_size} ranks a generated id could differ between ranks and break "
        "the per-step traces"
    )
