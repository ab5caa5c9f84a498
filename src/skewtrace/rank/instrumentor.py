"""``SkewtraceInstrumentor``: the OpenTelemetry instrumentor behind ``skewtrace.instrument()``.

Registered under the ``opentelemetry_instrumentor`` entry point, so
``opentelemetry-instrument python train.py`` instruments a training script with no code
change. There are two modes, chosen by the ``zero_code`` keyword:

- ``zero_code=False`` (``skewtrace.instrument()``'s default): called after
  ``init_process_group``; rank, world size and job id are resolved at once (several ranks
  with no job id agree on one through the process group's store: rank 0's is written at the
  call, the others read it at the call or on the export thread), and several ranks with
  neither a job id nor a process group raise ``ConfigError`` at the call. Hooks go on
  every ``torch.distributed`` collective, on ``torch.save``/``torch.load`` (checkpoint
  spans), and on what is passed: ``model`` (forward, backward, DDP gradient buckets),
  ``optimizer`` (else every optimizer's step ends a ``train.step``), ``dataloader``.
- ``zero_code=True`` (what ``opentelemetry-instrument`` does): may run before
  ``init_process_group``; rank, world size and job id are resolved on the export thread as
  soon as they are known (:mod:`skewtrace.rank._identity`: the default process group is seen as
  ``init_process_group`` sets it), and spans wait in the event buffer until then. If no job
  id can be had, that is logged once and the rank's spans are dropped and counted; training
  goes on.
  Besides the above, each ``DistributedDataParallel`` constructed afterwards is instrumented
  when no ``model`` is passed (forward, backward, gradient buckets), and every
  ``torch.utils.data.DataLoader`` iteration is timed when no ``dataloader`` is passed.

``SkewtraceInstrumentor().instrument()`` without ``zero_code`` is zero-code when it is given
no model, optimizer or dataloader (BaseInstrumentor's contract: no arguments does what
``opentelemetry-instrument`` does), explicit otherwise.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import threading
import weakref
from collections.abc import Collection, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from skewtrace import _log_limit, semconv
from skewtrace.rank._export.exporters import (
    OTEL_METRICS_EXPORTER,
    OTEL_TRACES_EXPORTER,
    metric_exporter_factories,
    span_exporter_factory,
)
from skewtrace.rank._export.materialize import Identity
from skewtrace.rank._export.self_metrics import SelfMetrics
from skewtrace.rank._export.sinks import ExporterSink, ProcessorSink, SpanSink
from skewtrace.rank._export.thread import BackgroundExporter
from skewtrace.rank._identity import IdentityResolver, group_of
from skewtrace.rank._job_id import JobIdError
from skewtrace.rank._recorder import Recorder
from skewtrace.rank.config import Settings
from skewtrace.rank.hooks import Patches
from skewtrace.rank.hooks._context import HookContext
from skewtrace.rank.resource import build_resource
from skewtrace.rank.telemetry import FetchCountingRecorder, NodeTelemetry

if TYPE_CHECKING:
    from skewtrace.rank.pacing_client import PacingClient, RankPacer

logger = logging.getLogger("skewtrace")

_instruments = ("torch >= 2.2",)

_METRICS_CLOSE_FLOOR_MILLIS = 2000
"""The least time the private metrics providers are given to shut down, in the background,
when the span exporter's final flush used up the shutdown budget: the SDK's
``MeterProvider.shutdown`` skips every reader once its deadline has passed, which left their
periodic export threads running (and retrying against a collector that was down) for the
rest of the process."""


def _sdk_provider(provider: Any) -> Any | None:
    """``provider`` if it is an SDK TracerProvider we can feed spans into, else None."""
    from opentelemetry.sdk.trace import TracerProvider

    return provider if isinstance(provider, TracerProvider) else None


def _model_device(model: Any) -> Any | None:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        return None


class Session:
    """One instrumentation: the recorder, the hooks it installed, the export thread."""

    def __init__(
        self,
        settings: Settings,
        *,
        model: Any | None,
        optimizer: Any | None,
        dataloader: Any | None,
        tracer_provider: Any | None,
        meter_provider: Any | None,
        pacing_client: Any | None,
        zero_code: bool,
    ) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._identity: Identity | None = None
        self._closed = False

        provider = tracer_provider
        if provider is None:
            from opentelemetry import trace

            provider = _sdk_provider(trace.get_tracer_provider())
        elif _sdk_provider(provider) is None:
            raise TypeError(
                "tracer_provider must be an opentelemetry.sdk.trace.TracerProvider "
                f"(got {type(provider).__name__})"
            )
        self._user_provider = provider
        if meter_provider is None:
            from opentelemetry import metrics
            from opentelemetry.sdk.metrics import MeterProvider

            global_meters = metrics.get_meter_provider()
            # Only a configured SDK provider; the API's proxy means "none set".
            if isinstance(global_meters, MeterProvider):
                meter_provider = global_meters

        # OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER choose the private exporters (a
        # provider of the user's was configured by them already): checked here, so a bad
        # name is a ConfigError from instrument(); built later, on the threads that use them.
        span_factory = span_exporter_factory() if self._user_provider is None else None
        if self._user_provider is None and span_factory is None:
            logger.info(
                "skewtrace: %s=none: no spans are exported (collectives and phases are still "
                "hooked, for pacing and node telemetry; SKEWTRACE_ENABLED=false removes "
                "every hook)",
                OTEL_TRACES_EXPORTER,
            )
        metrics_off = meter_provider is None and not metric_exporter_factories()
        if metrics_off:
            logger.info(
                "skewtrace: %s=none: skewtrace's own metrics and node telemetry are off",
                OTEL_METRICS_EXPORTER,
            )

        # Who we are: resolved now when we can, so that several ranks with neither a job id
        # nor a process group fail at the call site; else on the export thread.
        self._resolver = IdentityResolver(
            settings.job_id,
            timeout_s=settings.job_id_timeout_millis / 1000.0,
            wait_for_rank=zero_code,
            final_wait_s=settings.shutdown_timeout_millis / 2000.0,
        )
        if not zero_code:
            # A store that fails: the export thread says so and counts the drops.
            with contextlib.suppress(JobIdError):
                self._resolver.resolve()

        device = _model_device(model) if model is not None else None
        use_cuda, cuda_timer = self._cuda(model)
        # Node telemetry's data-loader counters are summed as the export thread drains.
        self.recorder = (
            FetchCountingRecorder(settings.buffer_events)
            if settings.node_telemetry
            else Recorder(settings.buffer_events)
        )
        self._log_limit_installed = False
        # Our HTTP pacing client needs the job id, so it starts once the identity is known.
        self._own_pacer = pacing_client is None and settings.pacer_url is not None
        self._pacer_client: PacingClient | None = None
        pacer: RankPacer | None = None
        if pacing_client is not None:
            from skewtrace.rank.pacing_client import as_rank_pacer

            pacer = as_rank_pacer(pacing_client)
        self.ctx = HookContext(self.recorder, pacer=pacer, device=device, cuda_timer=cuda_timer)

        sink: SpanSink | None
        if self._user_provider is not None:
            sink = ProcessorSink(self._user_provider)
        else:
            sink = ExporterSink(span_factory) if span_factory is not None else None
        self.exporter = BackgroundExporter(
            self.recorder,
            sink,
            self.identity,
            settings.export_interval_millis,
            cuda_timer,
            before_drain=self.ctx.works.poll,
        )
        self.metrics = SelfMetrics(
            self.recorder, self.exporter.stats, meter_provider, self._metrics_resource
        )
        # A private meter provider carries the rank's resource: started once the rank is
        # identified (or could not be), like node telemetry.
        self._metrics_now = meter_provider is not None
        self._metrics_off = metrics_off
        # Started once the rank's identity is known (at once, or on the export thread in
        # zero-code mode): local rank 0 samples the node, the GPU comes from gpu.uuid.
        self.node_telemetry: NodeTelemetry | None = None
        if settings.node_telemetry and not metrics_off:
            self.node_telemetry = NodeTelemetry(
                interval_s=settings.node_telemetry_interval_s,
                root=settings.node_telemetry_root,
                meter_provider=meter_provider,
                fetches=self.recorder if isinstance(self.recorder, FetchCountingRecorder) else None,
            )

        self.patches = Patches()
        try:
            self._install(model, optimizer, dataloader, use_cuda, zero_code)
        except BaseException:
            self.patches.restore()
            raise
        if self._metrics_now:
            self._start_self_metrics()
        if not zero_code:
            with contextlib.suppress(JobIdError):
                self.identity()
        if self._user_provider is None:
            # Our private exporters must not flood the training log while the collector
            # is down (the SDK logs every retry); failures are still counted. Installed
            # only once instrument() can no longer fail, so close() always removes it.
            _log_limit.install()
            self._log_limit_installed = True
        self.exporter.start()
        atexit.register(self.close)
        self._finalizer: Any | None = None
        try:
            from multiprocessing import util

            # multiprocessing children leave through os._exit, which skips atexit.
            self._finalizer = util.Finalize(self, Session.close, args=(self,), exitpriority=10)
        except Exception:
            logger.debug("skewtrace: no multiprocessing exit hook", exc_info=True)

    def _cuda(self, model: Any | None) -> tuple[bool, Any | None]:
        if model is None:
            return False, None
        try:
            from skewtrace.rank._cuda_timing import CudaEventTimer, cuda_available_for
        except ImportError:
            return False, None
        try:
            if cuda_available_for(model):
                return True, CudaEventTimer()
        except Exception:
            logger.warning(
                "skewtrace: CUDA event timing unavailable; using host clocks", exc_info=True
            )
        return False, None

    def _pacing_client(self, identity: Identity) -> PacingClient | None:
        settings = self.settings
        try:
            from skewtrace.rank.pacing_client import PacingClient

            client = PacingClient(
                str(settings.pacer_url),
                identity.job_id,
                identity.rank,
                max_delay_s=settings.pacer_rank_max_delay_s,
                poll_interval_s=settings.pacer_poll_interval_millis / 1000.0,
                token=settings.pacer_token,
            )
            client.start()
            return client
        except Exception:
            logger.warning("skewtrace: pacing client unavailable; pacing is off", exc_info=True)
            return None

    def _install(
        self,
        model: Any | None,
        optimizer: Any | None,
        dataloader: Any | None,
        use_cuda: bool,
        zero_code: bool,
    ) -> None:
        from skewtrace.rank.hooks import process_group
        from skewtrace.rank.hooks._work import patch_work_wait
        from skewtrace.rank.hooks.checkpoint import patch_checkpoint
        from skewtrace.rank.hooks.collectives import patch_collectives, patch_ddp_register
        from skewtrace.rank.hooks.dataloader import instrument_dataloader
        from skewtrace.rank.hooks.module import patch_backward
        from skewtrace.rank.hooks.optimizer import instrument_optimizer
        from skewtrace.rank.hooks.point_to_point import patch_point_to_point

        patch_work_wait(self.ctx.works, self.patches)
        self._start_flight_recorder()
        if self.settings.collective_hooks == "auto" and process_group.supported():
            self.ctx.process_groups = process_group.patch_process_groups(
                self.ctx, self.patches, skip=self._fr_covers
            )
        else:
            if self.settings.collective_hooks == "auto":
                logger.warning(
                    "skewtrace: this PyTorch calls no process-group hooks (2.15 and later "
                    "do): only torch.distributed functions and DDP buckets are traced; "
                    "functional collectives (FSDP2, DTensor, pipelining) are not"
                )
            patch_collectives(self.ctx, self.patches)
        patch_point_to_point(self.ctx, self.patches)
        patch_backward(self.ctx, self.patches)
        patch_ddp_register(self.patches)
        patch_checkpoint(self.ctx, self.patches)
        self._watch_default_group()
        if model is not None:
            self._instrument_model(model, use_cuda)
        elif zero_code:
            self._patch_ddp_init()
            self._discover_model()
        instrument_optimizer(self.ctx, optimizer, self.patches)
        if dataloader is not None:
            instrument_dataloader(self.ctx, dataloader, self.patches)
        elif zero_code:
            from skewtrace.rank.hooks.dataloader import patch_dataloader_class

            patch_dataloader_class(self.ctx, self.patches)

    # -- collectives read from c10d's Flight Recorder (skewtrace.rank.flight_recorder) -----
    flight_recorder: Any | None = None

    def _start_flight_recorder(self) -> None:
        """Under ``SKEWTRACE_COLLECTIVES=auto|flight_recorder``, read the groups the Flight
        Recorder covers from it; the process-group hooks then skip those groups."""
        from skewtrace.rank import flight_recorder as fr
        from skewtrace.rank.hooks import process_group

        mode = self.settings.collectives
        self._fr_mode = mode
        if mode == "hooks" or not process_group.supported():
            # Without group hooks the functions are wrapped, and they cannot skip a group.
            self._fr_mode = "hooks"
            return
        if mode == "auto" and not fr.device_timing_enabled():
            # auto covers only groups whose collectives have device timing (fr.covers): with
            # none possible, a reader would find no group to read and still dump the whole
            # ring every interval with the GIL held (on gloo, 25-41% of a core and steps 1.5-4.7
            # times longer; docs/performance.md). Same spans, no reader.
            self._fr_mode = "hooks"
            return
        if fr.api() is None or fr.buffer_size() <= 0:
            self._fr_mode = "hooks"
            if mode == "flight_recorder":
                logger.warning(
                    "skewtrace: SKEWTRACE_COLLECTIVES=flight_recorder but this PyTorch has no "
                    "Flight Recorder to read (or TORCH_FR_BUFFER_SIZE=0): collectives are "
                    "traced by the Python hooks"
                )
            return
        self._fr_groups: dict[str, Any] = {}
        self._fr_known: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self.flight_recorder = fr.FlightRecorderReader(
            self.recorder,
            self._fr_group,
            interval_s=self.settings.flight_recorder_interval_millis / 1000.0,
        )
        self._patch_destroy_process_group()
        self.flight_recorder.start()

    def _fr_covers(self, pg: Any) -> bool:
        """Whether the reader covers ``pg`` (decided once per group: the group hooks ask at
        every attach)."""
        if getattr(self, "_fr_mode", "hooks") == "hooks" or pg is None:
            return False
        known = self._fr_known.get(pg)
        if known is not None:
            return known
        from skewtrace.rank import flight_recorder as fr

        try:
            covered = fr.covers(pg, self._fr_mode)
        except Exception:
            logger.debug("skewtrace: Flight Recorder coverage unknown", exc_info=True)
            return False
        with contextlib.suppress(TypeError):
            self._fr_known[pg] = covered
        return covered

    def _fr_group(self, pg_name: str) -> Any | None:
        """The span group (name, size) of c10d's group ``pg_name``, if the reader covers it."""
        groups = self._fr_groups
        if pg_name in groups:
            return groups[pg_name]
        import torch.distributed.distributed_c10d as c10d

        from skewtrace.rank.flight_recorder import GroupInfo

        info = None
        for pg, name in list(getattr(c10d._world, "pg_names", {}).items()):
            if str(name) != pg_name:
                continue
            if self._fr_covers(pg):
                state = self.ctx.group_state(pg)
                if state is not None:
                    info = GroupInfo(state.name, state.size)
            groups[pg_name] = info
            break
        return info

    def _patch_destroy_process_group(self) -> None:
        """Read the Flight Recorder before a group goes: its entries stay in the ring, but
        its name no longer resolves afterwards."""
        import torch.distributed.distributed_c10d as c10d

        original = getattr(c10d, "destroy_process_group", None)
        reader = self.flight_recorder
        if original is None or reader is None:
            return

        @functools.wraps(original)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            with contextlib.suppress(Exception):
                reader.drain()
                # A group made later may take a destroyed one's name.
                reader.forget_groups()
                self._fr_groups.clear()
            return original(*args, **kwargs)

        self.patches.replace(c10d, "destroy_process_group", destroy_process_group, original)
        import torch.distributed as dist

        if getattr(dist, "destroy_process_group", None) is original:
            self.patches.replace(dist, "destroy_process_group", destroy_process_group, original)

    def _watch_default_group(self) -> None:
        """Learn of the default process group as ``init_process_group`` sets it (torch's
        ``_update_default_pg``), so that the rank and the store are known even when the
        group lives shorter than an export interval; without that function the export
        thread finds the group initialized instead."""
        import functools

        import torch.distributed.distributed_c10d as c10d

        original = getattr(c10d, "_update_default_pg", None)
        if original is None:
            return
        session = self

        @functools.wraps(original)
        def _update_default_pg(pg: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(pg, *args, **kwargs)
            if pg is not None and not session._closed:
                try:
                    group = group_of(pg)
                    if group is not None:
                        session._resolver.on_group(group)
                        session.exporter.flush_now()
                except Exception:
                    logger.debug("skewtrace: default process group not read", exc_info=True)
            return result

        self.patches.replace(c10d, "_update_default_pg", _update_default_pg, original)

    def _instrument_model(self, model: Any, use_cuda: bool) -> Any:
        from torch.nn.parallel import DistributedDataParallel

        from skewtrace.rank.hooks.collectives import detach_ddp, instrument_ddp
        from skewtrace.rank.hooks.module import instrument_module

        hooks = instrument_module(self.ctx, model, use_cuda, self.patches)
        if self.settings.layer_profile_every > 0:
            from skewtrace.rank.hooks.layers import install_layer_profiler

            try:
                install_layer_profiler(
                    self.ctx,
                    hooks,
                    model,
                    self.settings.layer_profile_every,
                    use_cuda,
                    self.patches,
                )
            except Exception:
                logger.warning("skewtrace: no layer profile for this model", exc_info=True)
        if isinstance(model, DistributedDataParallel) and not self._fr_covers(model.process_group):
            # Where the Flight Recorder covers the group its buckets are read from there.
            instrument_ddp(self.ctx, model)
            self.patches.on_restore(lambda: detach_ddp(model))
        return hooks

    def _discover_model(self) -> None:
        """Zero-code without DDP: adopt the outermost module with parameters at its first
        forward (hooks.module.ModelDiscovery)."""
        from skewtrace.rank.hooks.module import ModelDiscovery

        self._discovered: tuple[Any, Any] | None = None

        def adopt(module: Any) -> Any:
            if self._closed:
                return None
            hooks = self._adopt_model(module)
            self._discovered = (module, hooks)
            return hooks

        self._discovery = ModelDiscovery(self.ctx, adopt)
        self.patches.on_restore(self._discovery.stop)

    def _patch_ddp_init(self) -> None:
        import functools

        from torch.nn.parallel import DistributedDataParallel

        original = DistributedDataParallel.__dict__["__init__"]
        session = self

        @functools.wraps(original)
        def __init__(ddp: Any, *args: Any, **kwargs: Any) -> None:
            original(ddp, *args, **kwargs)
            if not session._closed:
                try:
                    session._discovery.stop()
                    if session._discovered is not None and session._discovered[0] is ddp.module:
                        # A forward ran before DDP wrapped the module: DDP's forward is the
                        # model's from now on, and the inner one would time it twice.
                        session._discovered[1].remove()
                        session._discovered = None
                    session._adopt_model(ddp)
                except Exception:
                    logger.warning("skewtrace: could not instrument DDP model", exc_info=True)

        self.patches.replace(DistributedDataParallel, "__init__", __init__, original)

    def _adopt_model(self, model: Any) -> Any:
        """Zero-code: instrument a model met after instrument() (a DDP model as it is built,
        or the one discovered at its first forward), CUDA timing included."""
        if self.ctx.device is None:
            self.ctx.device = _model_device(model)
        use_cuda = False
        if self.ctx.cuda_timer is None:
            use_cuda, timer = self._cuda(model)
            if timer is not None:
                self.ctx.cuda_timer = timer
                self.exporter.set_cuda_timer(timer)
        else:
            use_cuda = True
        return self._instrument_model(model, use_cuda)

    def identity(self, final: bool = False) -> Identity | None:
        """The rank's identity; None while it is not known yet (the export thread asks again
        each cycle; ``final``: at exit, where it is decided or raises)."""
        created = False
        try:
            with self._lock:
                if self._identity is None:
                    resolved = self._resolver.resolve(final)
                    if resolved is None:
                        return None
                    job_id, info = resolved
                    device_index = getattr(self.ctx.device, "index", None)
                    base = self._user_provider.resource if self._user_provider else None
                    resource = build_resource(job_id, info, device_index=device_index, base=base)
                    self._identity = Identity(job_id=job_id, rank=info.rank, resource=resource)
                    created = True
                    if self._own_pacer and not self._closed:
                        self._pacer_client = self._pacing_client(self._identity)
                        self.ctx.pacer = self._pacer_client
                identity = self._identity
        except Exception:
            # Never identified: the private metrics still report the drops, with the rank.
            self._start_self_metrics()
            raise
        if created:
            self._start_self_metrics()
            self._start_node_telemetry(identity)
        return identity

    def _start_self_metrics(self) -> None:
        # Also while closing: a rank never identified reports its drops in the final export.
        if self._metrics_off:
            return
        try:
            self.metrics.start()
        except Exception as e:
            # At exit (a rank that never got its identity) the SDK may no longer start.
            logger.warning("skewtrace: self-metrics disabled: %s", e)
            logger.debug("skewtrace: self-metrics disabled", exc_info=True)

    def _start_node_telemetry(self, identity: Identity) -> None:
        if self.node_telemetry is None:
            return
        try:
            self.node_telemetry.start(identity.resource)
        except Exception:
            logger.warning("skewtrace: node telemetry disabled", exc_info=True)

    def _metrics_resource(self) -> Any | None:
        """The private meter provider's resource: the rank's, or what is known of it."""
        identity = self._identity
        if identity is not None:
            return identity.resource
        from opentelemetry.sdk.resources import Resource

        info = self._resolver.rank_info
        attributes: dict[str, str | int] = {}
        if info is not None:
            attributes = {
                semconv.RANK: info.rank,
                semconv.LOCAL_RANK: info.local_rank,
                semconv.WORLD_SIZE: info.world_size,
            }
        resource = Resource.create(attributes)
        if str(resource.attributes.get(semconv.SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(
                Resource({semconv.SERVICE_NAME: semconv.DEFAULT_SERVICE_NAME})
            )
        return resource

    def flush(self) -> None:
        self.exporter.flush_now()

    def close(self) -> None:
        """Restore what was wrapped, then flush within the shutdown timeout. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.recorder.active = False
        self.patches.restore()
        if self.flight_recorder is not None:
            self.flight_recorder.stop()
        timeout = self.settings.shutdown_timeout_millis
        import time

        deadline = time.monotonic() + timeout / 1000.0
        self.exporter.shutdown(timeout)
        # Works still unfinished after the final cycle never get their span: counted.
        self.ctx.works.abandon()
        if self._pacer_client is not None:
            try:
                self._pacer_client.stop()
            except Exception:
                logger.debug("skewtrace: pacer client stop failed", exc_info=True)
        remaining = max(0, int((deadline - time.monotonic()) * 1000))
        # The metrics SDK's own shutdown is not bounded by our budget: run it aside, waited
        # for only within the budget, and always with enough time to stop its readers.
        closer = threading.Thread(
            target=self._close_metrics,
            args=(max(remaining, _METRICS_CLOSE_FLOOR_MILLIS),),
            daemon=True,
            name="skewtrace-metrics-close",
        )
        closer.start()
        closer.join(remaining / 1000.0)
        # Only now: the final flush is when a collector that is down makes the most noise.
        if self._log_limit_installed:
            self._log_limit_installed = False
            _log_limit.uninstall()
        atexit.unregister(self.close)
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer.cancel()

    def _close_metrics(self, timeout_millis: int) -> None:
        self._metrics_off = True  # not started after this
        try:
            self.metrics.shutdown(timeout_millis)
        except Exception:
            logger.debug("skewtrace: metrics shutdown failed", exc_info=True)
        if self.node_telemetry is not None:
            try:
                self.node_telemetry.shutdown(timeout_millis)
            except Exception:
                logger.debug("skewtrace: node telemetry shutdown failed", exc_info=True)


class SkewtraceInstrumentor(BaseInstrumentor):
    """Instruments distributed PyTorch training; see :func:`skewtrace.instrument`."""

    _session: Session | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        zero_code = kwargs.get("zero_code")
        if zero_code is None:
            zero_code = not any(
                kwargs.get(key) is not None for key in ("model", "optimizer", "dataloader")
            )
        settings = Settings.from_env(
            job_id=kwargs.get("job_id"),
            pacer_url=kwargs.get("pacer_url"),
            buffer_events=kwargs.get("buffer_events"),
            export_interval_millis=kwargs.get("export_interval_millis"),
            shutdown_timeout_millis=kwargs.get("shutdown_timeout_millis"),
        )
        if not settings.enabled:
            logger.info("skewtrace: disabled by SKEWTRACE_ENABLED/OTEL_SDK_DISABLED")
            return
        self._session = Session(
            settings,
            model=kwargs.get("model"),
            optimizer=kwargs.get("optimizer"),
            dataloader=kwargs.get("dataloader"),
            tracer_provider=kwargs.get("tracer_provider"),
            meter_provider=kwargs.get("meter_provider"),
            pacing_client=kwargs.get("pacing_client"),
            zero_code=bool(zero_code),
        )

    def _uninstrument(self, **kwargs: Any) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()

    @property
    def session(self) -> Session | None:
        return self._session


def traced_iterable(iterable: Iterable[Any]) -> Iterator[Any]:
    """Iterate ``iterable`` with a ``dataloader.fetch`` span per item (needs instrument())."""
    from skewtrace.rank.hooks.dataloader import traced_iterable as _traced

    session = SkewtraceInstrumentor().session
    if session is None:
        return iter(iterable)
    return _traced(iterable, session.ctx)
