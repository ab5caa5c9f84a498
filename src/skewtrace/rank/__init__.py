"""The rank side: everything a training process imports, and nothing else.

``skewtrace.instrument()`` (the package's top level) loads from here only: the session
(:mod:`~skewtrace.rank.instrumentor`, also the ``opentelemetry_instrumentor`` entry point), its
settings (:mod:`~skewtrace.rank.config`), the rank's identity and resource
(:mod:`~skewtrace.rank._identity`, :mod:`~skewtrace.rank._job_id`,
:mod:`~skewtrace.rank.resource`, :mod:`~skewtrace.rank.topology`), the hooks and their events
(:mod:`~skewtrace.rank.hooks`, :mod:`~skewtrace.rank._events`,
:mod:`~skewtrace.rank._recorder`, :mod:`~skewtrace.rank._cuda_timing`), the export thread
(:mod:`~skewtrace.rank._export`), node telemetry (:mod:`~skewtrace.rank.telemetry`), the
pacer's client (:mod:`~skewtrace.rank.pacing_client`) and the rebalancing sampler
(:mod:`~skewtrace.rank.rebalance_sampler`, which applies the shares that the service's
``rebalance`` policy, :mod:`skewtrace.controller.policies.rebalance`, publishes).

The services and tools a rank talks to (the pacer's controller, the timeline, the report, the
importer, the fabric emulator and the console script) live beside this package and are never
imported from it; the one exception is :mod:`skewtrace.decision`, the pacer's
answer format that both sides read (standard library only). Modules both sides use
(:mod:`skewtrace.semconv`, :mod:`skewtrace.version`, :mod:`skewtrace._options`, ...) are at the
top level. Nothing is imported here.
"""
