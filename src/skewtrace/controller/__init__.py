"""The controller behind ``skewtrace pacer``: barrierskew metrics in, per-job decisions out.

- :mod:`~skewtrace.controller.service`: :class:`PacerService`, the wiring (servers, windows,
  the decision loop, the pacer's own metrics); its settings, :class:`PacerConfig`, in
  :mod:`~skewtrace.controller.config`; :mod:`~skewtrace.controller.publish` (a policy's
  outcome as the body served, versioned) and :mod:`~skewtrace.controller.own_metrics`.
- :mod:`~skewtrace.controller.otlp_receiver` / :mod:`~skewtrace.controller.http_api`: the two
  servers (OTLP/gRPC metrics in; ``GET /v1/pacing?job=ID``, ``/v1/jobs``, ``/healthz``), with
  :mod:`~skewtrace.controller._auth` (token, TLS) and :mod:`~skewtrace.controller._limits`.
- :mod:`~skewtrace.controller.state`: per-job windows from OTLP histograms (cumulative or
  delta), bounded; it ties :mod:`~skewtrace.controller.otlp_points`,
  :mod:`~skewtrace.controller.deltas`, :mod:`~skewtrace.controller.collector_flags`,
  :mod:`~skewtrace.controller.group_phases`, :mod:`~skewtrace.controller.jobs`,
  :mod:`~skewtrace.controller.window_stats` and :mod:`~skewtrace.controller.decision_record`.
- :mod:`~skewtrace.controller.window`: the window every policy reads (:class:`JobWindow`,
  :class:`RankWindow`, the reasons they decline a job).
- :mod:`~skewtrace.controller.policies`: the registry of policies (``--policy``), one module
  each (``pacing``, ``rebalance``), the effect guard, the composition; all pure.
- :mod:`~skewtrace.decision`: the decision body served to the ranks, typed; the
  rank client (:mod:`skewtrace.rank.pacing_client`) reads it with the same module.

Nothing is imported here: the training process imports :mod:`skewtrace.decision`
(through the rank client) without the servers, grpc or the OTel SDK. See ``docs/pacing.md``.
"""
