"""Names that cross component boundaries: span names, attribute keys and their
well-known values, metric names and their Prometheus names.

This module is generated from src/semconv/registry.yaml by tools/semconvgen; do not edit: to add
or change a name, edit the registry and run ``make generate``. Documented in
``docs/semantic-conventions.md``; the Go collector has the same constants in
``src/collector/internal/semconv``. Call sites import these constants instead of writing string
literals.
"""

from __future__ import annotations

from skewtrace._promnames import HISTOGRAM_SERIES as HISTOGRAM_SERIES
from skewtrace._promnames import prometheus_label as prometheus_label
from skewtrace._promnames import prometheus_name as prometheus_name

# Resource attributes, one resource per rank process.
#: service.name (string): `OTEL_SERVICE_NAME`, else `skewtrace-training`
SERVICE_NAME = "service.name"
#: service.instance.id (string): `<job>/<rank>`
SERVICE_INSTANCE_ID = "service.instance.id"
#: training.job.id (string): the job id every rank agrees on
JOB_ID = "training.job.id"
#: training.rank (int): global rank
RANK = "training.rank"
#: training.local_rank (int): rank on its node
LOCAL_RANK = "training.local_rank"
#: training.world_size (int): number of ranks
WORLD_SIZE = "training.world_size"
#: host.name (string): the node
HOST_NAME = "host.name"
#: training.switch (string): leaf switch of the node, `unknown` when not known
SWITCH = "training.switch"
#: training.nic (string): NIC the rank's collectives use, `unknown` when not known
NIC = "training.nic"
#: gpu.uuid (string): only on GPU ranks
GPU_UUID = "gpu.uuid"
#: gpu.name (string): only on GPU ranks
GPU_NAME = "gpu.name"
#: gpu.pci_bus_id (string): only on GPU ranks
GPU_PCI_BUS_ID = "gpu.pci_bus_id"
#: gpu.numa_node (int): only on GPU ranks
GPU_NUMA_NODE = "gpu.numa_node"

# Values of service.name.
#: the service name of a rank process when `OTEL_SERVICE_NAME` is not set
DEFAULT_SERVICE_NAME = "skewtrace-training"

# Values of training.switch.
#: not known (also the value of `training.nic` and of GPU attributes that could not be read)
UNKNOWN = "unknown"

# Span names.
#: train.step.root: the step across all ranks (rank 0's iteration times)
SPAN_STEP_ROOT = "train.step.root"
#: train.step: this rank's iteration: from the end of its previous step (or its first fetch) to
#: the end of `optimizer.step`
SPAN_STEP = "train.step"
#: dataloader.fetch: time the rank waited for one batch
SPAN_DATALOADER_FETCH = "dataloader.fetch"
#: forward: the model's forward
SPAN_FORWARD = "forward"
#: backward: backward of the loss (with DDP it includes waiting for gradient all-reduces)
SPAN_BACKWARD = "backward"
#: optimizer.step: the optimizer step
SPAN_OPTIMIZER_STEP = "optimizer.step"
#: collective.<training.collective.op>: one collective call (the
#: `_into_tensor`/`_tensor`/`_single` variants map to their base op)
SPAN_COLLECTIVE_PREFIX = "collective."
#: pacing.delay: a delay applied by the pacer client
SPAN_PACING_DELAY = "pacing.delay"
#: train.step.summary: the step's analysis: its duration, what-if duration and slowdown, its
#: root causes and the flags after it (as events)
SPAN_STEP_SUMMARY = "train.step.summary"

# Events on the train.step.summary span.
#: training.root_cause: one contributor to this step's delay: a rank (`training.rank`, its
#: topology, `training.straggler.cause`, `training.rank.cost`) or a link (the suspect's kind and
#: name, `training.fabric.cost`)
EVENT_ROOT_CAUSE = "training.root_cause"
#: training.straggler: a rank flagged after this step (hysteresis): `training.rank`, its
#: topology, cause, `training.rank.cost` (moving average) and `training.straggler.domain`
EVENT_STRAGGLER = "training.straggler"
#: training.fabric.suspect: a suspected part of the fabric after this step: its kind, name (and
#: `host.name` for a NIC), `training.fabric.cost`, and whether it was derived from flagged ranks
EVENT_SUSPECT = "training.fabric.suspect"

# Span attributes set by the instrumentation.
#: training.step (int): the step index (0-based)
STEP = "training.step"
#: training.collective.op (string): the collective's base op (`all_reduce`, `all_gather`, ...);
#: the span name is `collective.<op>`
COLLECTIVE_OP = "training.collective.op"
#: training.collective.pg (string): process group name (`default` for the world group)
COLLECTIVE_PG = "training.collective.pg"
#: training.collective.peer (int): the other rank of a point-to-point message (global rank);
#: with the group and `training.collective.seq` (messages on this pair in this direction) it
#: joins the sender's span with the receiver's
COLLECTIVE_PEER = "training.collective.peer"
#: training.collective.pg_size (int): members in the group
COLLECTIVE_PG_SIZE = "training.collective.pg_size"
#: training.collective.seq (int): per-group sequence number, equal on every member for the same
#: call
COLLECTIVE_SEQ = "training.collective.seq"
#: training.collective.bytes (int): bytes of this rank's input
COLLECTIVE_BYTES = "training.collective.bytes"
#: training.collective.async (bool): `async_op=True` (span ends when the work completes)
COLLECTIVE_ASYNC = "training.collective.async"
#: training.collective.source (string): what issued the collective
COLLECTIVE_SOURCE = "training.collective.source"
#: training.timing (string): how the span's times were taken
TIMING = "training.timing"
#: training.pacing.delay (float s): the delay applied
PACING_DELAY = "training.pacing.delay"
#: training.pacing.version (int): the controller decision version it came from
PACING_VERSION = "training.pacing.version"

# Values of training.collective.op.
#: from `all_reduce`, and DDP's gradient buckets
OP_ALL_REDUCE = "all_reduce"
#: from `all_gather`, `all_gather_into_tensor`, `_all_gather_base`
OP_ALL_GATHER = "all_gather"
#: from `reduce_scatter`, `reduce_scatter_tensor`, `_reduce_scatter_base`
OP_REDUCE_SCATTER = "reduce_scatter"
#: from `broadcast`
OP_BROADCAST = "broadcast"
#: from `barrier`
OP_BARRIER = "barrier"
#: from `all_to_all`, `all_to_all_single`
OP_ALL_TO_ALL = "all_to_all"
#: from `reduce`
OP_REDUCE = "reduce"
#: from `gather`
OP_GATHER = "gather"
#: from `scatter`
OP_SCATTER = "scatter"
#: from `send`, `isend` and the sends of `batch_isend_irecv` (point-to-point)
OP_SEND = "send"
#: from `recv`, `irecv` and the receives of `batch_isend_irecv` (point-to-point)
OP_RECV = "recv"
#: a joined point-to-point message (sender and receiver) in the collector's figures and metrics
OP_SEND_RECV = "send_recv"

# Values of training.collective.pg.
#: the world group
DEFAULT_PG_NAME = "default"

# Values of training.collective.source.
#: a `torch.distributed` call
SOURCE_API = "api"
#: a DDP gradient bucket (through skewtrace's comm hook)
SOURCE_DDP = "ddp"

# Values of training.timing.
#: host clock reads
TIMING_HOST = "host"
#: device timing from CUDA events
TIMING_CUDA_EVENT = "cuda_event"
#: device timing from NCCL's completion hook
TIMING_NCCL_HOOK = "nccl_hook"

# Annotations the barrierskew processor adds to collective spans.
#: training.barrier.skew (float s): latest arrival minus earliest: max(duration) - min(duration)
BARRIER_SKEW = "training.barrier.skew"
#: training.barrier.lateness (float s): this rank's arrival minus the earliest: max(duration) -
#: duration
BARRIER_LATENESS = "training.barrier.lateness"
#: training.barrier.wait (float s): latest arrival minus this rank's: duration - min(duration)
BARRIER_WAIT = "training.barrier.wait"
#: training.barrier.transfer (float s): duration after the last arrival: min(duration) over
#: members (what the network took)
BARRIER_TRANSFER = "training.barrier.transfer"
#: training.clock.offset (float s): this host's end timestamp minus the median end timestamp of
#: the members
CLOCK_OFFSET = "training.clock.offset"
#: training.collective.slowdown (float): the transfer over its reference from the job's history
#: (its group's, and same-shaped collectives of other groups); absent while there is no
#: reference
COLLECTIVE_SLOWDOWN = "training.collective.slowdown"
#: training.straggler (bool): true on the flagged rank that was the late one in this collective;
#: false on members not flagged; absent on a flagged member that was not late here (so readers
#: see flags set and cleared)
STRAGGLER = "training.straggler"
#: training.straggler.cause (string): what the flagged rank's own work that made steps late was
#: (with `training.straggler`)
STRAGGLER_CAUSE = "training.straggler.cause"
#: training.straggler.domain (string): the suspect a flagged rank belongs to: `nic:<host>/<nic>`
#: (its own link), `switch:<name>` (flagged ranks on two or more hosts behind it), `host:<name>`
#: (two or more flagged ranks on it)
STRAGGLER_DOMAIN = "training.straggler.domain"
#: training.barrier.missing_ranks (int): how many members never arrived (released after
#: `wait_timeout`)
BARRIER_MISSING_RANKS = "training.barrier.missing_ranks"
#: training.barrier.missing (string): the missing ranks, comma separated
BARRIER_MISSING = "training.barrier.missing"
#: training.barrier.released (string): why a collective was released before every member arrived
#: (on incomplete collectives only)
BARRIER_RELEASED = "training.barrier.released"
#: training.barrier.unjoined (string): on a collective span the processor forwarded without a
#: join: why (`missing:<key>`, `mistyped:<key>`, `oversized:<key>`, `duplicate`, `late_arrival`,
#: ...); a connector behind it does not join it again
BARRIER_UNJOINED = "training.barrier.unjoined"

# Values of training.straggler.cause.
#: its `dataloader.fetch` took longer than its peers' median by enough to explain the lateness
CAUSE_DATA = "data"
#: its forward, backward (outside gradient communication) or optimizer did
CAUSE_COMPUTE = "compute"
#: its own link (its host's NIC, or its host) was located as what made the step's transfers slow
CAUSE_NETWORK = "network"
#: no phase explains the rank's excess own work, or the rank never arrived
CAUSE_UNKNOWN = "unknown"

# Values of training.barrier.released.
#: `wait_timeout` passed and the missing ranks had fallen silent (or `max_wait` passed):
#: evidence of missing ranks, counted in `training.rank.missing`
RELEASED_TIMEOUT = "timeout"
#: a memory bound (`max_pending`, `max_buffered_spans`) forced it out early
RELEASED_EVICTED = "evicted"
#: the collector was stopping
RELEASED_SHUTDOWN = "shutdown"
#: it began within `startup_grace` after the collector started: its missing members may have
#: gone to the instance before a restart; not counted as incomplete or missing
RELEASED_PARTIAL = "partial"

# Attributes of the train.step.summary span and its events.
#: training.step.duration (float s): the job's step time on the analysis' timeline: from the
#: latest rank being free after the previous step to the latest rank finishing its collectives
#: in this one
STEP_DURATION = "training.step.duration"
#: training.step.whatif (float s): the step time with this step's root causes at their
#: references
STEP_WHATIF = "training.step.whatif"
#: training.job.slowdown (float): the job's moving average of step time over what-if step time
JOB_SLOWDOWN = "training.job.slowdown"
#: training.step.ranks (int): ranks with spans in the step
STEP_RANKS = "training.step.ranks"
#: training.step.slow_collectives (int): collectives of the step whose transfer was slow against
#: their reference
STEP_SLOW_COLLECTIVES = "training.step.slow_collectives"
#: training.rank.cost (float s): what the rank cost: in a root cause, this step's seconds (the
#: step with the rank's own work at its peers' median alone); on a flag, the moving average
RANK_COST = "training.rank.cost"
#: training.fabric.cost (float s): what a suspected link cost (this step's seconds, or the
#: moving average)
FABRIC_COST = "training.fabric.cost"
#: training.fabric.suspect.kind (string): what part of the fabric is suspected
SUSPECT_KIND = "training.fabric.suspect.kind"
#: training.fabric.suspect.name (string): the NIC, host or switch name
SUSPECT_NAME = "training.fabric.suspect.name"
#: training.fabric.suspect.derived (bool): true when the suspect is named because flagged ranks
#: share it, false when slow transfers located it
SUSPECT_DERIVED = "training.fabric.suspect.derived"

# Values of training.fabric.suspect.kind.
#: a NIC of one host (`host.name` says which host): in every slow group and in no healthy one
SUSPECT_NIC = "nic"
#: a host: all its NICs implicated, or two or more of its ranks flagged for their own work
SUSPECT_HOST = "host"
#: a leaf switch's uplink: the groups that cross it are slow, the groups inside it are not
SUSPECT_UPLINK = "uplink"
#: a leaf switch: flagged ranks on two or more of its hosts, or every group touching it slow
SUSPECT_SWITCH = "switch"

# Metrics emitted by the barrierskew connector.
#: training.barrier.skew (histogram, s): Barrier skew: latest minus earliest arrival at a
#: collective.
METRIC_BARRIER_SKEW = "training.barrier.skew"
#: training.rank.lateness (histogram, s): A rank's arrival at a collective minus the earliest
#: arrival.
METRIC_RANK_LATENESS = "training.rank.lateness"
#: training.rank.wait (histogram, s): How long a rank waited at a collective for the last
#: arrival.
METRIC_RANK_WAIT = "training.rank.wait"
#: training.straggler (gauge 0/1, 1): 1 while the rank is flagged as a straggler, with its
#: cause.
METRIC_STRAGGLER = "training.straggler"
#: training.rank.cost (gauge, s): Seconds per step a flagged rank has cost the job recently: how
#: much shorter its steps would have been with the rank's own work (or its link) at its
#: reference.
METRIC_RANK_COST = "training.rank.cost"
#: training.job.slowdown (gauge, 1): A job's step time over its what-if step time with its root
#: causes at their references (moving average; 1 when nothing holds it up).
METRIC_JOB_SLOWDOWN = "training.job.slowdown"
#: training.fabric.suspect (gauge 0/1, 1): 1 while a part of the fabric (a host's NIC, a host, a
#: switch's uplink, a switch) is suspected of making the job's steps late.
METRIC_FABRIC_SUSPECT = "training.fabric.suspect"
#: training.fabric.cost (gauge, s): Seconds per step a suspected part of the fabric has cost the
#: job recently (0 when no longer suspected).
METRIC_FABRIC_COST = "training.fabric.cost"
#: training.collective.incomplete (counter, 1): Collectives released before every member
#: arrived.
METRIC_COLLECTIVE_INCOMPLETE = "training.collective.incomplete"
#: training.rank.missing (counter, 1): Collectives released without this rank (it never
#: arrived).
METRIC_RANK_MISSING = "training.rank.missing"
#: training.clock.offset (gauge, s): The host's clock minus the median clock of its collectives'
#: members (smoothed).
METRIC_CLOCK_OFFSET = "training.clock.offset"
#: training.step.duration (histogram, s): A rank's training step duration.
METRIC_STEP_DURATION = "training.step.duration"

# Their Prometheus names (histograms add HISTOGRAM_SERIES).
PROM_BARRIER_SKEW = "training_barrier_skew_seconds"
PROM_RANK_LATENESS = "training_rank_lateness_seconds"
PROM_RANK_WAIT = "training_rank_wait_seconds"
PROM_STRAGGLER = "training_straggler_ratio"
PROM_RANK_COST = "training_rank_cost_seconds"
PROM_JOB_SLOWDOWN = "training_job_slowdown_ratio"
PROM_FABRIC_SUSPECT = "training_fabric_suspect_ratio"
PROM_FABRIC_COST = "training_fabric_cost_seconds"
PROM_COLLECTIVE_INCOMPLETE = "training_collective_incomplete_total"
PROM_RANK_MISSING = "training_rank_missing_total"
PROM_CLOCK_OFFSET = "training_clock_offset_seconds"
PROM_STEP_DURATION = "training_step_duration_seconds"

CONNECTOR_METRICS = (
    METRIC_BARRIER_SKEW,
    METRIC_RANK_LATENESS,
    METRIC_RANK_WAIT,
    METRIC_STRAGGLER,
    METRIC_RANK_COST,
    METRIC_JOB_SLOWDOWN,
    METRIC_FABRIC_SUSPECT,
    METRIC_FABRIC_COST,
    METRIC_COLLECTIVE_INCOMPLETE,
    METRIC_RANK_MISSING,
    METRIC_CLOCK_OFFSET,
    METRIC_STEP_DURATION,
)

# Metrics from the training process (its own health).
#: skewtrace.events.dropped (counter, 1): events dropped because the rank's buffer was full
METRIC_EVENTS_DROPPED = "skewtrace.events.dropped"
#: skewtrace.spans.exported (counter, 1): spans handed to the exporter
METRIC_SPANS_EXPORTED = "skewtrace.spans.exported"
#: skewtrace.spans.export_failed (counter, 1): spans the exporter reported as failed
METRIC_SPANS_EXPORT_FAILED = "skewtrace.spans.export_failed"

# Their Prometheus names (histograms add HISTOGRAM_SERIES).
PROM_EVENTS_DROPPED = "skewtrace_events_dropped_total"
PROM_SPANS_EXPORTED = "skewtrace_spans_exported_total"
PROM_SPANS_EXPORT_FAILED = "skewtrace_spans_export_failed_total"

# Data point attributes of the training process's own metrics.
#: reason (string): why the counted items were dropped, refused or rejected; the values depend
#: on the metric: `buffer_full` on `skewtrace.events.dropped`, and those in the notes of
#: `skewtrace.pacer.otlp.requests.refused`, `skewtrace.pacer.points.rejected` and
#: `skewtrace.pacer.http.requests.refused`
REASON = "reason"

# Metrics from the pacer.
#: skewtrace.pacing.active (gauge 0/1, 1): 1 while pacing is on for the job
METRIC_PACING_ACTIVE = "skewtrace.pacing.active"
#: skewtrace.pacing.delay (gauge, s): Current pacing delay per rank
METRIC_PACING_DELAY = "skewtrace.pacing.delay"
#: skewtrace.rebalance.share (gauge, 1): Current share of the global batch per rank (`--policy
#: rebalance`), while shares are published
METRIC_REBALANCE_SHARE = "skewtrace.rebalance.share"
#: skewtrace.pacing.decisions (counter, 1): Pacing decisions computed (one per job per tick)
METRIC_PACING_DECISIONS = "skewtrace.pacing.decisions"
#: skewtrace.pacer.otlp.requests.refused (counter, 1): OTLP export requests the pacer refused;
#: none of their points was used.
METRIC_PACER_OTLP_REFUSED = "skewtrace.pacer.otlp.requests.refused"
#: skewtrace.pacer.points.rejected (counter, 1): Data points the pacer received and dropped
#: (reported back as rejected).
METRIC_PACER_POINTS_REJECTED = "skewtrace.pacer.points.rejected"
#: skewtrace.pacer.http.requests.refused (counter, 1): HTTP requests the pacer refused and
#: connections it closed early.
METRIC_PACER_HTTP_REFUSED = "skewtrace.pacer.http.requests.refused"

# Their Prometheus names (histograms add HISTOGRAM_SERIES).
PROM_PACING_ACTIVE = "skewtrace_pacing_active_ratio"
PROM_PACING_DELAY = "skewtrace_pacing_delay_seconds"
PROM_REBALANCE_SHARE = "skewtrace_rebalance_share_ratio"
PROM_PACING_DECISIONS = "skewtrace_pacing_decisions_total"
PROM_PACER_OTLP_REFUSED = "skewtrace_pacer_otlp_requests_refused_total"
PROM_PACER_POINTS_REJECTED = "skewtrace_pacer_points_rejected_total"
PROM_PACER_HTTP_REFUSED = "skewtrace_pacer_http_requests_refused_total"
