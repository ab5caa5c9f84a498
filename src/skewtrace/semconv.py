"""Names that cross component boundaries: span names, attribute keys and their
well-known values, metric names and their Prometheus names.

This module is generated from src/semconv/registry.yaml by tools/semconvgen; do not edit: to add
or change a name, edit the registry and run ``make generate``. Documented in
``docs/semantic-conventions.md``; the Go collector has the same constants in
``src/collector/internal/semconv``. Call sites import these constants instead of writing string
literals.
"""

from __future__ import annotations

from typing import NamedTuple

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
#: training.worker.first_gpu (int): only on a rank that stands for a worker, a tensor-parallel
#: group of GPUs (`skewtrace import` of a what-if table): the global rank of the worker's first
#: GPU
WORKER_FIRST_GPU = "training.worker.first_gpu"
#: training.worker.gpus (int): with `training.worker.first_gpu`: the worker's GPUs (its
#: tensor-parallel size), global ranks `first_gpu` to `first_gpu + gpus - 1`
WORKER_GPUS = "training.worker.gpus"
#: training.dp_rank (int): with `training.worker.first_gpu`: the worker's data-parallel replica
#: (0 first); its pipeline stage is `training.pipeline.stage` on the same resource
DP_RANK = "training.dp_rank"

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
#: pipeline.layers: the forward and backward time of each child module (layer) of the rank's
#: model over the step's micro-batches: `training.pipeline.layers`,
#: `training.pipeline.layer.forward`, `training.pipeline.layer.backward`,
#: `training.pipeline.microbatches` (what the Collector proposes a stage partition from; the
#: rank's stage is the Collector's, from its point-to-point messages, as for every verdict).
#: Layers are the model's child modules, through a wrapper whose only child is a container; a
#: layer's backward runs from its output's gradient to its input's
SPAN_PIPELINE_LAYERS = "pipeline.layers"
#: pacing.delay: a delay applied by the pacer client
SPAN_PACING_DELAY = "pacing.delay"
#: train.step.summary: the step's analysis: its duration, what-if duration and slowdown, its
#: root causes and the flags after it (as events)
SPAN_STEP_SUMMARY = "train.step.summary"
#: checkpoint.save: one `torch.save`: `training.checkpoint.bytes` and
#: `training.checkpoint.path_kind`
SPAN_CHECKPOINT_SAVE = "checkpoint.save"
#: checkpoint.load: one `torch.load`: `training.checkpoint.bytes` and
#: `training.checkpoint.path_kind`
SPAN_CHECKPOINT_LOAD = "checkpoint.load"
#: timeline.first_change: the components that changed before a step-time regression, earliest
#: first (attributes of the first, all as `training.change` events)
SPAN_FIRST_CHANGE = "timeline.first_change"

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
#: training.imbalance: an imbalance of the job flagged after this step (K of W steps,
#: hysteresis): `training.straggler.cause` (`stage_imbalance` or `data_imbalance`),
#: `training.pipeline.stage` and `training.imbalance.ranks` for a stage,
#: `training.imbalance.excess`, `training.imbalance.cost` (moving average) and
#: `training.imbalance.fix`
EVENT_IMBALANCE = "training.imbalance"
#: training.attribution: what fixing one kind of work alone would save in this step (the step
#: replayed with only that kind at its reference): `training.attribution.kind` and
#: `training.attribution.saves`; written in steps with a root cause, for each kind that saves
#: something
EVENT_ATTRIBUTION = "training.attribution"
#: training.group.phase: one communication phase of one process group in this step (its
#: collectives of one op): `training.collective.pg`, `training.collective.op`,
#: `training.group.phase.start`, `training.group.phase.duration`, `training.group.switches` and
#: `training.group.hosts` (the `training.group.phase.*` metrics are built from them); at most 64
#: a step, the longest
EVENT_GROUP_PHASE = "training.group.phase"

# Events on the timeline.first_change span.
#: training.change: one component whose signal changed before the regression:
#: `training.component.kind`, `training.component`, `training.signal`, `training.change.order`,
#: `training.change.onset`, `training.change.ratio` and `training.change.effect`; only changes
#: on the job's path (docs/timeline.md)
EVENT_CHANGE = "training.change"

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
#: training.input.size (int): elements of the tensors the forward call received (its arguments,
#: tensors one list, tuple or dict deep, and two deep: a batch given as a list of samples, each
#: a tuple or dict of tensors): the size of its work where sequence lengths or batch sizes vary
#: per rank and step, the evidence of a `data_imbalance` on jobs without pipeline stages; absent
#: when the call received no tensor
INPUT_SIZE = "training.input.size"
#: training.pacing.delay (float s): the delay applied
PACING_DELAY = "training.pacing.delay"
#: training.pacing.version (int): the controller decision version it came from
PACING_VERSION = "training.pacing.version"
#: training.balance.mode (string): how the work-balanced sampler
#: (`skewtrace.rank.work_balance.WorkBalancedSampler`) split the global batch of the batch this
#: fetch returned; absent with any other sampler
BALANCE_MODE = "training.balance.mode"
#: training.balance.version (int): with `training.balance.mode`: the controller's
#: `balance_version` the mode came from (sampler mode `pacer`), else 0
BALANCE_VERSION = "training.balance.version"
#: training.balance.cost_version (int): with `training.balance.mode`: the cost model the split
#: priced samples with: 0 for the configured or default one, n for the n-th fit the ranks agreed
#: on at a sync point
BALANCE_COST_VERSION = "training.balance.cost_version"
#: training.checkpoint.bytes (int): the checkpoint file's size (absent when written to or read
#: from a stream)
CHECKPOINT_BYTES = "training.checkpoint.bytes"
#: training.checkpoint.path_kind (string): where the file lives: `local` (a block-device
#: filesystem), `network` (NFS, Lustre, GPFS, CephFS, ...), `memory` (tmpfs), `stream` (a file
#: object), `unknown`
CHECKPOINT_PATH_KIND = "training.checkpoint.path_kind"

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
#: issued through the process group: a `torch.distributed` call, a functional collective
#: (DTensor, FSDP2, pipelining), a process-group method
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
#: read from c10d's Flight Recorder: start when the entry was created (the call enqueued it),
#: duration the device's own (NCCL's duration_ms, with TORCH_NCCL_ENABLE_TIMING=1)
TIMING_FLIGHT_RECORDER = "flight_recorder"
#: read from c10d's Flight Recorder without a device duration: start when the entry was created,
#: end when it was seen done by polling: NCCL's watchdog, or (gloo, which records no completion)
#: skewtrace's reader, up to one read interval late
TIMING_FLIGHT_RECORDER_POLLED = "flight_recorder_polled"

# Values of training.balance.mode.
#: samples assigned to ranks by their cost (equal work per rank, within its share)
BALANCE_WORK = "work"
#: consecutive slices of equal count (within its share), as `DistributedSampler`
BALANCE_COUNT = "count"

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
#: training.straggler.before (string): with cause `host_work`: where in the step the rank's own
#: time sat, as the span it preceded (`forward`, `backward`, `optimizer.step`,
#: `dataloader.fetch`, or a collective span such as `collective.all_reduce`): the longest
#: stretch of its excess time outside every phase span
STRAGGLER_BEFORE = "training.straggler.before"
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
#: its own host-side work outside every traced phase did (Python preprocessing, logging, a
#: callback, a synchronous checkpoint, garbage collection): time between its spans that no
#: `dataloader.fetch`, `forward`, `backward` or `optimizer.step` holds;
#: `training.straggler.before` says what it preceded
CAUSE_HOST_WORK = "host_work"
#: no phase explains the rank's excess own work, or the rank never arrived
CAUSE_UNKNOWN = "unknown"
#: a pipeline stage does more work per step than the mean stage on every replica
#: (`training.pipeline.stage`); a partition of the layers, not a rank, is what to fix (a root
#: cause or imbalance without a rank)
CAUSE_STAGE_IMBALANCE = "stage_imbalance"
#: work varies across data-parallel replicas from step to step with no persistent rank (sequence
#: lengths, dynamic batches); a balanced split of each global batch is what to fix (a root cause
#: or imbalance without a rank)
CAUSE_DATA_IMBALANCE = "data_imbalance"

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
#: training.step.whatif (float s): the step time with every rank's work and every transfer at
#: its reference (the what-if analysis' ideal step: on a pipeline every op at the median of its
#: kind over the step's ranks, so a stage heavier than the others counts; elsewhere each rank's
#: work at its peers' median)
STEP_WHATIF = "training.step.whatif"
#: training.job.slowdown (float): the job's moving average of step time over what-if step time
JOB_SLOWDOWN = "training.job.slowdown"
#: training.replay.error (float): the replay's self-check: the replayed step fed the measured
#: gaps and transfers against the measured one (the median rank's period on its own clock), as a
#: fraction; absent in a job's first step and in steps with pacing holds
REPLAY_ERROR = "training.replay.error"
#: training.verdict.deferred (bool): true on a summary written with `flag_decision: deferred` (a
#: gateway's tier-2 instance, which sees some of a job's steps): its events carry the step's
#: root causes only, and the `barrierskewverdict` processor that receives every summary of the
#: job writes the summary with the job's flags; absent otherwise
VERDICT_DEFERRED = "training.verdict.deferred"
#: training.step.ranks (int): ranks with spans in the step
STEP_RANKS = "training.step.ranks"
#: training.step.absent (int): ranks of the job's world (`training.world_size`) that had not
#: ended the step when it was analyzed (after `step_timeout`, or a bound forced it); absent when
#: every rank had
STEP_ABSENT = "training.step.absent"
#: training.step.absent_ranks (string): with `training.step.absent`: the first 64 of those
#: ranks, comma separated
STEP_ABSENT_RANKS = "training.step.absent_ranks"
#: training.step.min_saving (float s): the least a rank or a link had to save in the step to be
#: named a root cause: the larger of `min_cost`, `min_cost_fraction` of the step and twice the
#: job's step jitter (the median change of its step time over its last 16 steps); twice
#: `min_cost` or the fraction before the jitter is known
STEP_MIN_SAVING = "training.step.min_saving"
#: training.step.slow_collectives (int): collectives of the step whose transfer was slow against
#: their reference
STEP_SLOW_COLLECTIVES = "training.step.slow_collectives"
#: training.rank.cost (float s): what the rank cost: in a root cause, this step's seconds that
#: fixing it alone saves (the step replayed with only the rank's own work at its peers' median,
#: or its link's transfers at their reference; for ranks that hold the step up together, what
#: each adds to their joint fix where that is more); on a flag, the moving average
RANK_COST = "training.rank.cost"
#: training.pipeline.stage (int): the pipeline stage (0 first), found from the point-to-point
#: messages: a rank whose first message of the step is a send is stage 0, one whose first is a
#: receive is one more than its sender's
PIPELINE_STAGE = "training.pipeline.stage"
#: training.pipeline.layers (string[]): the names of the rank's layers (its model's child
#: modules), in order
PIPELINE_LAYERS = "training.pipeline.layers"
#: training.pipeline.layer.forward (float[] s): each layer's forward seconds in the step, summed
#: over its micro-batches (one per `training.pipeline.layers` name)
PIPELINE_LAYER_FORWARD = "training.pipeline.layer.forward"
#: training.pipeline.layer.backward (float[] s): each layer's backward seconds in the step,
#: summed over its micro-batches
PIPELINE_LAYER_BACKWARD = "training.pipeline.layer.backward"
#: training.pipeline.microbatches (int): the forwards of the rank's model in the step (its
#: micro-batches)
PIPELINE_MICROBATCHES = "training.pipeline.microbatches"
#: training.imbalance.partition (int[]): the advised layers per stage (contiguous, stages in
#: order): the partition of all stages' layers that minimizes the slowest stage's layer time
#: (then the sum of squares, then the smaller counts first)
IMBALANCE_PARTITION = "training.imbalance.partition"
#: training.imbalance.partition.current (int[]): the layers per stage now (from the profiles)
IMBALANCE_PARTITION_CURRENT = "training.imbalance.partition.current"
#: training.imbalance.partition.before (float[] s): each stage's layer time per step now
#: (forward plus backward, summed over micro-batches)
IMBALANCE_PARTITION_BEFORE = "training.imbalance.partition.before"
#: training.imbalance.partition.after (float[] s): each stage's layer time per step under the
#: advised partition
IMBALANCE_PARTITION_AFTER = "training.imbalance.partition.after"
#: training.imbalance.partition.saving (float s): seconds of the step the advised partition
#: saves: the step replayed with each stage's layer time moved from now to the advice (its other
#: pipeline work kept), against the step replayed as it is
IMBALANCE_PARTITION_SAVING = "training.imbalance.partition.saving"
#: training.imbalance.ranks (string): the stage's ranks, comma separated; on a step's
#: `data_imbalance` root cause, the step's slowest replica (one rank: a replica slowest in
#: nearly every step is a straggler, not the data)
IMBALANCE_RANKS = "training.imbalance.ranks"
#: training.imbalance.excess (float): how much more work than balanced: a stage's work per step
#: over the mean stage's, minus 1; for data, the slowest replica's work over the mean replica's,
#: minus 1
IMBALANCE_EXCESS = "training.imbalance.excess"
#: training.imbalance.cost (float s): seconds of the step the imbalance costs: the replayed step
#: minus the replayed step with it balanced (on `training.imbalance`, a moving average over the
#: flag window)
IMBALANCE_COST = "training.imbalance.cost"
#: training.imbalance.fix (string): what to change, in words ("moving about 19% of stage 3's
#: work to stage 2 saves about 15% of the step")
IMBALANCE_FIX = "training.imbalance.fix"
#: training.attribution.kind (string): a kind of work: `compute` (every rank's own work between
#: its collectives: data loading, forward, backward, optimizer) or a collective op
#: (`training.collective.op`'s values; `send_recv` for point-to-point messages)
ATTRIBUTION_KIND = "training.attribution.kind"
#: training.attribution.saves (float s): seconds the replayed step is shorter with every
#: instance of that kind of work at its reference and everything else as measured (the what-if
#: analysis' S_t)
ATTRIBUTION_SAVES = "training.attribution.saves"
#: training.group.phase.start (float s): the group's members' first collective launch after
#: their own `train.step` start (each on its own clock), the median member's
GROUP_PHASE_START = "training.group.phase.start"
#: training.group.phase.duration (float s): from that launch to the member's last collective's
#: end in the step, the median member's
GROUP_PHASE_DURATION = "training.group.phase.duration"
#: training.group.hosts (string): the hosts of a process group's members, sorted and comma
#: separated (`many` past 16): groups that share a host are tied, since its ranks step together
GROUP_HOSTS = "training.group.hosts"
#: training.group.switches (string): the leaf switches of a process group's members, sorted and
#: comma separated (`unknown` where not known, `many` past 8): a group behind more than one
#: switch crosses their uplinks, where groups whose phases overlap collide
GROUP_SWITCHES = "training.group.switches"
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

# Values of training.attribution.kind.
#: the ranks' own work between collectives, at their peers' median (and their own history)
ATTRIBUTION_COMPUTE = "compute"

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
#: training.replay.error (gauge, 1): The step replay's self-check: how far the replayed step,
#: fed the measured durations, is from the measured one, as a fraction (moving average).
METRIC_REPLAY_ERROR = "training.replay.error"
#: training.attribution (gauge, s): Seconds per step that one kind of work at its reference
#: would save the job (moving average over the analyzed steps, a step where it saves nothing
#: counting 0): where to look first, by kind.
METRIC_ATTRIBUTION = "training.attribution"
#: training.group.phase.start (gauge, s): When a process group's communication phase of one op
#: begins in the job's step: its members' first collective launch after their own step start
#: (each on its own clock, so no host clock is trusted), the median member's (moving average).
METRIC_GROUP_PHASE_START = "training.group.phase.start"
#: training.group.phase.duration (gauge, s): How long a process group's communication phase of
#: one op lasts in the job's step: from its members' first collective launch to their last
#: collective's end, the median member's (moving average).
METRIC_GROUP_PHASE_DURATION = "training.group.phase.duration"
#: training.imbalance (gauge 0/1, 1): 1 while an imbalance of the job is flagged: a pipeline
#: stage longer than the mean stage (`stage_imbalance`, with its stage), or work split unevenly
#: across data-parallel replicas (`data_imbalance`, stage -1).
METRIC_IMBALANCE = "training.imbalance"
#: training.imbalance.cost (gauge, s): Seconds per step a flagged imbalance has cost the job
#: recently: the replayed step minus the replayed step with the work balanced (0 once no longer
#: flagged).
METRIC_IMBALANCE_COST = "training.imbalance.cost"
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
#: training.collective.transfer (histogram, s): A joined collective's transfer: the time after
#: its last arrival, `training.barrier.transfer` (what the network took).
METRIC_COLLECTIVE_TRANSFER = "training.collective.transfer"

# Their Prometheus names (histograms add HISTOGRAM_SERIES).
PROM_BARRIER_SKEW = "training_barrier_skew_seconds"
PROM_RANK_LATENESS = "training_rank_lateness_seconds"
PROM_RANK_WAIT = "training_rank_wait_seconds"
PROM_STRAGGLER = "training_straggler_ratio"
PROM_RANK_COST = "training_rank_cost_seconds"
PROM_JOB_SLOWDOWN = "training_job_slowdown_ratio"
PROM_REPLAY_ERROR = "training_replay_error_ratio"
PROM_ATTRIBUTION = "training_attribution_seconds"
PROM_GROUP_PHASE_START = "training_group_phase_start_seconds"
PROM_GROUP_PHASE_DURATION = "training_group_phase_duration_seconds"
PROM_IMBALANCE = "training_imbalance_ratio"
PROM_IMBALANCE_COST = "training_imbalance_cost_seconds"
PROM_FABRIC_SUSPECT = "training_fabric_suspect_ratio"
PROM_FABRIC_COST = "training_fabric_cost_seconds"
PROM_COLLECTIVE_INCOMPLETE = "training_collective_incomplete_total"
PROM_RANK_MISSING = "training_rank_missing_total"
PROM_CLOCK_OFFSET = "training_clock_offset_seconds"
PROM_STEP_DURATION = "training_step_duration_seconds"
PROM_COLLECTIVE_TRANSFER = "training_collective_transfer_seconds"

CONNECTOR_METRICS = (
    METRIC_BARRIER_SKEW,
    METRIC_RANK_LATENESS,
    METRIC_RANK_WAIT,
    METRIC_STRAGGLER,
    METRIC_RANK_COST,
    METRIC_JOB_SLOWDOWN,
    METRIC_REPLAY_ERROR,
    METRIC_ATTRIBUTION,
    METRIC_GROUP_PHASE_START,
    METRIC_GROUP_PHASE_DURATION,
    METRIC_IMBALANCE,
    METRIC_IMBALANCE_COST,
    METRIC_FABRIC_SUSPECT,
    METRIC_FABRIC_COST,
    METRIC_COLLECTIVE_INCOMPLETE,
    METRIC_RANK_MISSING,
    METRIC_CLOCK_OFFSET,
    METRIC_STEP_DURATION,
    METRIC_COLLECTIVE_TRANSFER,
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

# Node telemetry from the training process (local rank 0 samples its node; every rank its own
# GPU and I/O).
#: system.network.io (counter, By): bytes through an interface
#: (`/sys/class/net/<if>/statistics`)
METRIC_NETWORK_IO = "system.network.io"
#: system.network.speed (gauge, By/s): an interface's negotiated link speed
#: (`/sys/class/net/<if>/speed`, Mbit/s, as bytes per second): what a NIC that trained down to a
#: lower rate shows; absent where the interface reports none (down, or virtual without one)
METRIC_NETWORK_SPEED = "system.network.speed"
#: system.network.packet.count (counter, 1): packets through an interface
METRIC_NETWORK_PACKETS = "system.network.packet.count"
#: system.network.errors (counter, 1): an interface's receive or transmit errors
METRIC_NETWORK_ERRORS = "system.network.errors"
#: system.network.packet.dropped (counter, 1): packets an interface dropped
METRIC_NETWORK_DROPPED = "system.network.packet.dropped"
#: training.nic.port.counter (counter, 1): an InfiniBand or RoCE port counter
#: (`/sys/class/infiniband/<dev>/ports/<p>/counters` and `hw_counters`), raw name in
#: `training.nic.counter`, its operational meaning in `training.nic.signal`
METRIC_NIC_PORT_COUNTER = "training.nic.port.counter"
#: training.tcp.retransmits (counter, 1): TCP segments retransmitted in the rank's network
#: namespace (`/proc/net/snmp` `RetransSegs`)
METRIC_TCP_RETRANSMITS = "training.tcp.retransmits"
#: training.qdisc.drops (counter, 1): packets a queueing discipline dropped
METRIC_QDISC_DROPS = "training.qdisc.drops"
#: training.qdisc.overlimits (counter, 1): times a shaping qdisc held a packet back over its
#: rate
METRIC_QDISC_OVERLIMITS = "training.qdisc.overlimits"
#: training.qdisc.backlog (gauge, By): bytes queued in a qdisc: the mean of ten samples over the
#: collection interval (one instant says little: a link at its limit fills and empties within a
#: step)
METRIC_QDISC_BACKLOG = "training.qdisc.backlog"
#: training.qdisc.rate (gauge, By/s): the rate a shaping qdisc (tbf) holds the interface to;
#: only qdiscs that have one. Where links are shaped (the emulated fabric), a link that slows
#: down shows here
METRIC_QDISC_RATE = "training.qdisc.rate"
#: system.disk.io (counter, By): bytes read from or written to a block device
#: (`/proc/diskstats`)
METRIC_DISK_IO = "system.disk.io"
#: system.disk.operations (counter, 1): a block device's completed reads or writes
METRIC_DISK_OPERATIONS = "system.disk.operations"
#: system.disk.operation_time (counter, s): time spent on a block device's reads or writes (rate
#: over the operations' rate is the latency)
METRIC_DISK_OPERATION_TIME = "system.disk.operation_time"
#: training.process.io (counter, By): storage bytes the rank process and its data-loader workers
#: read or wrote (`/proc/<pid>/io`)
METRIC_PROCESS_IO = "training.process.io"
#: training.dataloader.wait (counter, s): time the rank waited for batches, the sum of its
#: `dataloader.fetch` spans (rate over the fetches' rate is the latency the training loop sees)
METRIC_DATALOADER_WAIT = "training.dataloader.wait"
#: training.dataloader.fetches (counter, 1): batches the rank fetched
METRIC_DATALOADER_FETCHES = "training.dataloader.fetches"
#: hw.gpu.utilization (gauge, 1): fraction of the sample period a kernel ran on the rank's GPU
#: (NVML)
METRIC_GPU_UTILIZATION = "hw.gpu.utilization"
#: hw.gpu.memory.usage (gauge, By): GPU memory in use
METRIC_GPU_MEMORY_USAGE = "hw.gpu.memory.usage"
#: training.gpu.sm_clock (gauge, Hz): the GPU's current SM clock
METRIC_GPU_SM_CLOCK = "training.gpu.sm_clock"
#: training.gpu.throttle (gauge 0/1, 1): 1 while NVML reports the clock held back for this
#: reason
METRIC_GPU_THROTTLE = "training.gpu.throttle"
#: training.gpu.power (gauge, W): GPU power draw
METRIC_GPU_POWER = "training.gpu.power"
#: training.gpu.temperature (gauge, Cel): GPU core temperature
METRIC_GPU_TEMPERATURE = "training.gpu.temperature"
#: training.gpu.ecc.errors (counter, 1): ECC errors since the driver loaded (`error.type`
#: `corrected` or `uncorrected`)
METRIC_GPU_ECC_ERRORS = "training.gpu.ecc.errors"
#: training.gpu.xid (counter, 1): XID error events NVML reported while the rank ran
METRIC_GPU_XID = "training.gpu.xid"
#: hw.gpu.io (counter, By): PCIe bytes to (`receive`) and from (`transmit`) the GPU, integrated
#: from NVML's throughput samples
METRIC_GPU_PCIE_IO = "hw.gpu.io"
#: training.gpu.nvlink.io (counter, By): NVLink bytes over all the GPU's links, where NVML
#: exposes the counters
METRIC_GPU_NVLINK_IO = "training.gpu.nvlink.io"

# Their Prometheus names (histograms add HISTOGRAM_SERIES).
PROM_NETWORK_IO = "system_network_io_bytes_total"
PROM_NETWORK_SPEED = "system_network_speed_bytes_per_second"
PROM_NETWORK_PACKETS = "system_network_packet_count_total"
PROM_NETWORK_ERRORS = "system_network_errors_total"
PROM_NETWORK_DROPPED = "system_network_packet_dropped_total"
PROM_NIC_PORT_COUNTER = "training_nic_port_counter_total"
PROM_TCP_RETRANSMITS = "training_tcp_retransmits_total"
PROM_QDISC_DROPS = "training_qdisc_drops_total"
PROM_QDISC_OVERLIMITS = "training_qdisc_overlimits_total"
PROM_QDISC_BACKLOG = "training_qdisc_backlog_bytes"
PROM_QDISC_RATE = "training_qdisc_rate_bytes_per_second"
PROM_DISK_IO = "system_disk_io_bytes_total"
PROM_DISK_OPERATIONS = "system_disk_operations_total"
PROM_DISK_OPERATION_TIME = "system_disk_operation_time_seconds_total"
PROM_PROCESS_IO = "training_process_io_bytes_total"
PROM_DATALOADER_WAIT = "training_dataloader_wait_seconds_total"
PROM_DATALOADER_FETCHES = "training_dataloader_fetches_total"
PROM_GPU_UTILIZATION = "hw_gpu_utilization_ratio"
PROM_GPU_MEMORY_USAGE = "hw_gpu_memory_usage_bytes"
PROM_GPU_SM_CLOCK = "training_gpu_sm_clock_hertz"
PROM_GPU_THROTTLE = "training_gpu_throttle_ratio"
PROM_GPU_POWER = "training_gpu_power_watts"
PROM_GPU_TEMPERATURE = "training_gpu_temperature_celsius"
PROM_GPU_ECC_ERRORS = "training_gpu_ecc_errors_total"
PROM_GPU_XID = "training_gpu_xid_total"
PROM_GPU_PCIE_IO = "hw_gpu_io_bytes_total"
PROM_GPU_NVLINK_IO = "training_gpu_nvlink_io_bytes_total"

# Data point attributes of the node telemetry and the timeline.
#: network.interface.name (string): a network interface, as the node names it (`eth0`)
NETWORK_INTERFACE = "network.interface.name"
#: network.io.direction (string): `transmit` or `receive`
NETWORK_DIRECTION = "network.io.direction"
#: system.device (string): a block device (`sda`, `nvme0n1`, `loop3`)
SYSTEM_DEVICE = "system.device"
#: disk.io.direction (string): `read` or `write`
DISK_DIRECTION = "disk.io.direction"
#: training.nic.device (string): an RDMA device (`mlx5_0`)
NIC_DEVICE = "training.nic.device"
#: training.nic.port (int): the RDMA device's port number
NIC_PORT = "training.nic.port"
#: training.nic.counter (string): the counter's file name as the driver exposes it
#: (`port_xmit_wait`, `np_cnp_sent`)
NIC_COUNTER = "training.nic.counter"
#: training.nic.signal (string): what the counter means operationally, the same for InfiniBand
#: and RoCE
NIC_SIGNAL = "training.nic.signal"
#: training.qdisc.kind (string): the qdisc's kind (`tbf`, `htb`, `fq_codel`, `mq`)
QDISC_KIND = "training.qdisc.kind"
#: training.gpu.throttle.reason (string): NVML's clock event reason: `sw_power_cap`,
#: `hw_slowdown`, `hw_thermal_slowdown`, `hw_power_brake_slowdown`, `sw_thermal_slowdown`,
#: `sync_boost`
GPU_THROTTLE_REASON = "training.gpu.throttle.reason"
#: error.type (string): `corrected` or `uncorrected` (ECC)
ERROR_TYPE = "error.type"
#: training.gpu.xid.code (int): the XID number NVML reported
GPU_XID_CODE = "training.gpu.xid.code"
#: training.component.kind (string): the kind of component a change was found on
COMPONENT_KIND = "training.component.kind"
#: training.component (string): the component's name (`node3/eth0`, `leaf1`, `node0/loop7`)
COMPONENT = "training.component"
#: training.signal (string): the metric whose level changed, with its distinguishing labels
#: (`training.qdisc.drops{tbf}`)
SIGNAL = "training.signal"
#: training.change.effect (bool): true when the change is an effect, not a cause: a throughput
#: figure that falls whenever steps slow down, or a signal that moved in the direction that
#: cannot hurt (a consumer never infers it from the order)
CHANGE_EFFECT = "training.change.effect"
#: training.change.order (int): 0 for the first component to change, then in order of onset
CHANGE_ORDER = "training.change.order"
#: training.change.onset (float s): when the signal changed (Unix seconds)
CHANGE_ONSET = "training.change.onset"
#: training.change.ratio (float): the signal's level after the change over its level before (the
#: rate for counters)
CHANGE_RATIO = "training.change.ratio"

# Values of network.io.direction.
#: sent by the interface (or the GPU)
DIRECTION_TRANSMIT = "transmit"
#: received by the interface (or the GPU)
DIRECTION_RECEIVE = "receive"

# Values of disk.io.direction.
#: read from storage
DIRECTION_READ = "read"
#: written to storage
DIRECTION_WRITE = "write"

# Values of training.nic.signal.
#: symbol, link-recovery, link-down and integrity errors
NIC_SIGNAL_LINK_ERROR = "link_error"
#: packets received with errors
NIC_SIGNAL_RECEIVE_ERROR = "receive_error"
#: packets the port discarded
NIC_SIGNAL_DISCARD = "discard"
#: ticks the port had data to send and no credit (back-pressure)
NIC_SIGNAL_XMIT_WAIT = "xmit_wait"
#: transport retries and timeouts (`local_ack_timeout_err`, `out_of_sequence`, ...)
NIC_SIGNAL_RETRANSMIT = "retransmit"
#: ECN marks and congestion notification packets (`np_ecn_marked_roce_packets`,
#: `rp_cnp_handled`, ...)
NIC_SIGNAL_CONGESTION = "congestion"
#: data and packet counts
NIC_SIGNAL_TRAFFIC = "traffic"
#: any counter not mapped above (still exported, raw)
NIC_SIGNAL_OTHER = "other"

# Values of training.component.kind.
#: the ranks' step time (the regression being explained)
COMPONENT_STEP = "step"
#: collective transfer time of a process group
COMPONENT_COLLECTIVE = "collective"
#: a rank's data-loader wait
COMPONENT_DATALOADER = "dataloader"
#: a host's network interface (`<host>/<interface>`)
COMPONENT_NIC = "nic"
#: a switch (signals of the nodes behind it that change together)
COMPONENT_SWITCH = "switch"
#: a rank's GPU (`<host>/<gpu.uuid>`)
COMPONENT_GPU = "gpu"
#: a host's block device or the rank's own storage I/O (`<host>/<device>`)
COMPONENT_DISK = "disk"
#: a host-wide signal (TCP retransmits)
COMPONENT_HOST = "host"

# Metrics from `skewtrace timeline watch` (the first component to change).
#: training.first_change (gauge, s): a change found before the job's latest step-time
#: regression: its onset in Unix seconds; order 0 is the first component to change
METRIC_FIRST_CHANGE = "training.first_change"

# Their Prometheus names (histograms add HISTOGRAM_SERIES).
PROM_FIRST_CHANGE = "training_first_change_seconds"

# Data point attributes of the training process's own metrics.
#: skewtrace.controller.policy (string): the controller policy a figure is about (`pacing`)
CONTROLLER_POLICY = "skewtrace.controller.policy"
#: reason (string): why the counted items were dropped, refused or rejected; the values depend
#: on the metric: `buffer_full`, `no_job_id` (no job id could be had: the rank's spans are
#: dropped) and `no_identity` on `skewtrace.events.dropped`, and those in the notes of
#: `skewtrace.pacer.otlp.requests.refused`, `skewtrace.pacer.points.rejected` and
#: `skewtrace.pacer.http.requests.refused`
REASON = "reason"

# Metrics from the pacer.
#: skewtrace.pacing.active (gauge 0/1, 1): 1 while pacing is on for the job
METRIC_PACING_ACTIVE = "skewtrace.pacing.active"
#: skewtrace.controller.effect (gauge, 1): What the policy's decisions did to the job's step
#: time, measured by alternating phases with them published and withheld: the mean gain as a
#: fraction of the step time (positive: shorter steps), from the latest experiment; absent
#: before the first pair
METRIC_CONTROLLER_EFFECT = "skewtrace.controller.effect"
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
PROM_CONTROLLER_EFFECT = "skewtrace_controller_effect_ratio"
PROM_PACING_DELAY = "skewtrace_pacing_delay_seconds"
PROM_REBALANCE_SHARE = "skewtrace_rebalance_share_ratio"
PROM_PACING_DECISIONS = "skewtrace_pacing_decisions_total"
PROM_PACER_OTLP_REFUSED = "skewtrace_pacer_otlp_requests_refused_total"
PROM_PACER_POINTS_REJECTED = "skewtrace_pacer_points_rejected_total"
PROM_PACER_HTTP_REFUSED = "skewtrace_pacer_http_requests_refused_total"


class MetricSpec(NamedTuple):
    """A metric's instrument, unit and description, as the registry gives them:
    instruments are created from these, never from literals of their own."""

    instrument: str
    unit: str
    description: str


#: Every metric of the registry by name.
METRICS: dict[str, MetricSpec] = {
    METRIC_BARRIER_SKEW: MetricSpec(
        "histogram",
        "s",
        "Barrier skew: latest minus earliest arrival at a collective.",
    ),
    METRIC_RANK_LATENESS: MetricSpec(
        "histogram",
        "s",
        "A rank's arrival at a collective minus the earliest arrival.",
    ),
    METRIC_RANK_WAIT: MetricSpec(
        "histogram",
        "s",
        "How long a rank waited at a collective for the last arrival.",
    ),
    METRIC_STRAGGLER: MetricSpec(
        "gauge",
        "1",
        "1 while the rank is flagged as a straggler, with its cause.",
    ),
    METRIC_RANK_COST: MetricSpec(
        "gauge",
        "s",
        "Seconds per step a flagged rank has cost the job recently: how much shorter its "
        "steps would have been with the rank's own work (or its link) at its reference.",
    ),
    METRIC_JOB_SLOWDOWN: MetricSpec(
        "gauge",
        "1",
        "A job's step time over its what-if step time with its root causes at their "
        "references (moving average; 1 when nothing holds it up).",
    ),
    METRIC_REPLAY_ERROR: MetricSpec(
        "gauge",
        "1",
        "The step replay's self-check: how far the replayed step, fed the measured durations,"
        " is from the measured one, as a fraction (moving average).",
    ),
    METRIC_ATTRIBUTION: MetricSpec(
        "gauge",
        "s",
        "Seconds per step that one kind of work at its reference would save the job (moving "
        "average over the analyzed steps, a step where it saves nothing counting 0): where to"
        " look first, by kind.",
    ),
    METRIC_GROUP_PHASE_START: MetricSpec(
        "gauge",
        "s",
        "When a process group's communication phase of one op begins in the job's step: its "
        "members' first collective launch after their own step start (each on its own clock, "
        "so no host clock is trusted), the median member's (moving average).",
    ),
    METRIC_GROUP_PHASE_DURATION: MetricSpec(
        "gauge",
        "s",
        "How long a process group's communication phase of one op lasts in the job's step: "
        "from its members' first collective launch to their last collective's end, the median"
        " member's (moving average).",
    ),
    METRIC_IMBALANCE: MetricSpec(
        "gauge",
        "1",
        "1 while an imbalance of the job is flagged: a pipeline stage longer than the mean "
        "stage (stage_imbalance, with its stage), or work split unevenly across data-parallel"
        " replicas (data_imbalance, stage -1).",
    ),
    METRIC_IMBALANCE_COST: MetricSpec(
        "gauge",
        "s",
        "Seconds per step a flagged imbalance has cost the job recently: the replayed step "
        "minus the replayed step with the work balanced (0 once no longer flagged).",
    ),
    METRIC_FABRIC_SUSPECT: MetricSpec(
        "gauge",
        "1",
        "1 while a part of the fabric (a host's NIC, a host, a switch's uplink, a switch) is "
        "suspected of making the job's steps late.",
    ),
    METRIC_FABRIC_COST: MetricSpec(
        "gauge",
        "s",
        "Seconds per step a suspected part of the fabric has cost the job recently (0 when no"
        " longer suspected).",
    ),
    METRIC_COLLECTIVE_INCOMPLETE: MetricSpec(
        "counter",
        "1",
        "Collectives released before every member arrived.",
    ),
    METRIC_RANK_MISSING: MetricSpec(
        "counter",
        "1",
        "Collectives released without this rank (it never arrived).",
    ),
    METRIC_CLOCK_OFFSET: MetricSpec(
        "gauge",
        "s",
        "The host's clock minus the median clock of its collectives' members (smoothed).",
    ),
    METRIC_STEP_DURATION: MetricSpec(
        "histogram",
        "s",
        "A rank's training step duration.",
    ),
    METRIC_COLLECTIVE_TRANSFER: MetricSpec(
        "histogram",
        "s",
        "A joined collective's transfer: the time after its last arrival, "
        "training.barrier.transfer (what the network took).",
    ),
    METRIC_EVENTS_DROPPED: MetricSpec(
        "counter",
        "1",
        "events dropped because the rank's buffer was full",
    ),
    METRIC_SPANS_EXPORTED: MetricSpec(
        "counter",
        "1",
        "spans handed to the exporter",
    ),
    METRIC_SPANS_EXPORT_FAILED: MetricSpec(
        "counter",
        "1",
        "spans the exporter reported as failed",
    ),
    METRIC_NETWORK_IO: MetricSpec(
        "counter",
        "By",
        "bytes through an interface (/sys/class/net/<if>/statistics)",
    ),
    METRIC_NETWORK_SPEED: MetricSpec(
        "gauge",
        "By/s",
        "an interface's negotiated link speed (/sys/class/net/<if>/speed, Mbit/s, as bytes "
        "per second): what a NIC that trained down to a lower rate shows; absent where the "
        "interface reports none (down, or virtual without one)",
    ),
    METRIC_NETWORK_PACKETS: MetricSpec(
        "counter",
        "1",
        "packets through an interface",
    ),
    METRIC_NETWORK_ERRORS: MetricSpec(
        "counter",
        "1",
        "an interface's receive or transmit errors",
    ),
    METRIC_NETWORK_DROPPED: MetricSpec(
        "counter",
        "1",
        "packets an interface dropped",
    ),
    METRIC_NIC_PORT_COUNTER: MetricSpec(
        "counter",
        "1",
        "an InfiniBand or RoCE port counter (/sys/class/infiniband/<dev>/ports/<p>/counters "
        "and hw_counters), raw name in training.nic.counter, its operational meaning in "
        "training.nic.signal",
    ),
    METRIC_TCP_RETRANSMITS: MetricSpec(
        "counter",
        "1",
        "TCP segments retransmitted in the rank's network namespace (/proc/net/snmp RetransSegs)",
    ),
    METRIC_QDISC_DROPS: MetricSpec(
        "counter",
        "1",
        "packets a queueing discipline dropped",
    ),
    METRIC_QDISC_OVERLIMITS: MetricSpec(
        "counter",
        "1",
        "times a shaping qdisc held a packet back over its rate",
    ),
    METRIC_QDISC_BACKLOG: MetricSpec(
        "gauge",
        "By",
        "bytes queued in a qdisc: the mean of ten samples over the collection interval (one "
        "instant says little: a link at its limit fills and empties within a step)",
    ),
    METRIC_QDISC_RATE: MetricSpec(
        "gauge",
        "By/s",
        "the rate a shaping qdisc (tbf) holds the interface to; only qdiscs that have one. "
        "Where links are shaped (the emulated fabric), a link that slows down shows here",
    ),
    METRIC_DISK_IO: MetricSpec(
        "counter",
        "By",
        "bytes read from or written to a block device (/proc/diskstats)",
    ),
    METRIC_DISK_OPERATIONS: MetricSpec(
        "counter",
        "1",
        "a block device's completed reads or writes",
    ),
    METRIC_DISK_OPERATION_TIME: MetricSpec(
        "counter",
        "s",
        "time spent on a block device's reads or writes (rate over the operations' rate is "
        "the latency)",
    ),
    METRIC_PROCESS_IO: MetricSpec(
        "counter",
        "By",
        "storage bytes the rank process and its data-loader workers read or wrote (/proc/<pid>/io)",
    ),
    METRIC_DATALOADER_WAIT: MetricSpec(
        "counter",
        "s",
        "time the rank waited for batches, the sum of its dataloader.fetch spans (rate over "
        "the fetches' rate is the latency the training loop sees)",
    ),
    METRIC_DATALOADER_FETCHES: MetricSpec(
        "counter",
        "1",
        "batches the rank fetched",
    ),
    METRIC_GPU_UTILIZATION: MetricSpec(
        "gauge",
        "1",
        "fraction of the sample period a kernel ran on the rank's GPU (NVML)",
    ),
    METRIC_GPU_MEMORY_USAGE: MetricSpec(
        "gauge",
        "By",
        "GPU memory in use",
    ),
    METRIC_GPU_SM_CLOCK: MetricSpec(
        "gauge",
        "Hz",
        "the GPU's current SM clock",
    ),
    METRIC_GPU_THROTTLE: MetricSpec(
        "gauge",
        "1",
        "1 while NVML reports the clock held back for this reason",
    ),
    METRIC_GPU_POWER: MetricSpec(
        "gauge",
        "W",
        "GPU power draw",
    ),
    METRIC_GPU_TEMPERATURE: MetricSpec(
        "gauge",
        "Cel",
        "GPU core temperature",
    ),
    METRIC_GPU_ECC_ERRORS: MetricSpec(
        "counter",
        "1",
        "ECC errors since the driver loaded (error.type corrected or uncorrected)",
    ),
    METRIC_GPU_XID: MetricSpec(
        "counter",
        "1",
        "XID error events NVML reported while the rank ran",
    ),
    METRIC_GPU_PCIE_IO: MetricSpec(
        "counter",
        "By",
        "PCIe bytes to (receive) and from (transmit) the GPU, integrated from NVML's "
        "throughput samples",
    ),
    METRIC_GPU_NVLINK_IO: MetricSpec(
        "counter",
        "By",
        "NVLink bytes over all the GPU's links, where NVML exposes the counters",
    ),
    METRIC_FIRST_CHANGE: MetricSpec(
        "gauge",
        "s",
        "a change found before the job's latest step-time regression: its onset in Unix "
        "seconds; order 0 is the first component to change",
    ),
    METRIC_PACING_ACTIVE: MetricSpec(
        "gauge",
        "1",
        "1 while pacing is on for the job",
    ),
    METRIC_CONTROLLER_EFFECT: MetricSpec(
        "gauge",
        "1",
        "What the policy's decisions did to the job's step time, measured by alternating "
        "phases with them published and withheld: the mean gain as a fraction of the step "
        "time (positive: shorter steps), from the latest experiment; absent before the first "
        "pair",
    ),
    METRIC_PACING_DELAY: MetricSpec(
        "gauge",
        "s",
        "Current pacing delay per rank",
    ),
    METRIC_REBALANCE_SHARE: MetricSpec(
        "gauge",
        "1",
        "Current share of the global batch per rank (--policy rebalance), while shares are "
        "published",
    ),
    METRIC_PACING_DECISIONS: MetricSpec(
        "counter",
        "1",
        "Pacing decisions computed (one per job per tick)",
    ),
    METRIC_PACER_OTLP_REFUSED: MetricSpec(
        "counter",
        "1",
        "OTLP export requests the pacer refused; none of their points was used.",
    ),
    METRIC_PACER_POINTS_REJECTED: MetricSpec(
        "counter",
        "1",
        "Data points the pacer received and dropped (reported back as rejected).",
    ),
    METRIC_PACER_HTTP_REFUSED: MetricSpec(
        "counter",
        "1",
        "HTTP requests the pacer refused and connections it closed early.",
    ),
}
