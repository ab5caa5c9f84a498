"""Names that cross component boundaries: span names, attribute keys, metric names.

Documented in ``docs/semantic-conventions.md``; the Go collector keeps the same names in
``src/collector/internal/semconv``. Call sites import these constants instead of writing
string literals.
"""

from __future__ import annotations

# Resource attributes
SERVICE_NAME = "service.name"
SERVICE_INSTANCE_ID = "service.instance.id"
JOB_ID = "training.job.id"
RANK = "training.rank"
LOCAL_RANK = "training.local_rank"
WORLD_SIZE = "training.world_size"
HOST_NAME = "host.name"
SWITCH = "training.switch"
NIC = "training.nic"
GPU_UUID = "gpu.uuid"
GPU_NAME = "gpu.name"
GPU_PCI_BUS_ID = "gpu.pci_bus_id"
GPU_NUMA_NODE = "gpu.numa_node"

UNKNOWN = "unknown"
DEFAULT_SERVICE_NAME = "skewtrace-training"

# Span names
SPAN_STEP_ROOT = "train.step.root"
SPAN_STEP = "train.step"
SPAN_DATALOADER_FETCH = "dataloader.fetch"
SPAN_FORWARD = "forward"
SPAN_BACKWARD = "backward"
SPAN_OPTIMIZER_STEP = "optimizer.step"
SPAN_COLLECTIVE_PREFIX = "collective."
SPAN_PACING_DELAY = "pacing.delay"

# Span attributes
STEP = "training.step"
COLLECTIVE_OP = "training.collective.op"
COLLECTIVE_PG = "training.collective.pg"
COLLECTIVE_PG_SIZE = "training.collective.pg_size"
COLLECTIVE_SEQ = "training.collective.seq"
COLLECTIVE_BYTES = "training.collective.bytes"
COLLECTIVE_ASYNC = "training.collective.async"
COLLECTIVE_SOURCE = "training.collective.source"
TIMING = "training.timing"
PACING_DELAY = "training.pacing.delay"
PACING_VERSION = "training.pacing.version"

DEFAULT_PG_NAME = "default"

# Annotations added by the barrierskew processor
BARRIER_SKEW = "training.barrier.skew"
BARRIER_LATENESS = "training.barrier.lateness"
BARRIER_WAIT = "training.barrier.wait"
BARRIER_TRANSFER = "training.barrier.transfer"
CLOCK_OFFSET = "training.clock.offset"
STRAGGLER = "training.straggler"
STRAGGLER_CAUSE = "training.straggler.cause"
STRAGGLER_DOMAIN = "training.straggler.domain"
BARRIER_MISSING_RANKS = "training.barrier.missing_ranks"
BARRIER_MISSING = "training.barrier.missing"

CAUSES = ("data", "compute", "network", "unknown")

# Metrics from the barrierskew connector
METRIC_BARRIER_SKEW = "training.barrier.skew"
METRIC_RANK_LATENESS = "training.rank.lateness"
METRIC_RANK_WAIT = "training.rank.wait"
METRIC_STRAGGLER = "training.straggler"
METRIC_STRAGGLER_DOMAIN = "training.straggler.domain"
METRIC_COLLECTIVE_INCOMPLETE = "training.collective.incomplete"
METRIC_CLOCK_OFFSET = "training.clock.offset"
METRIC_STEP_DURATION = "training.step.duration"

# Metrics from the training process
METRIC_EVENTS_DROPPED = "skewtrace.events.dropped"
METRIC_SPANS_EXPORTED = "skewtrace.spans.exported"
METRIC_SPANS_EXPORT_FAILED = "skewtrace.spans.export_failed"

# Metrics from the pacer
METRIC_PACING_ACTIVE = "skewtrace.pacing.active"
METRIC_PACING_DELAY = "skewtrace.pacing.delay"
METRIC_PACING_DECISIONS = "skewtrace.pacing.decisions"
