"""The series the timeline looks at, and how each names the component it belongs to.

Every entry reads one registered metric (``semconv.PROM_*``) of the job and says which
``training.component.kind`` a change in it points at, how its labels name the component
(``<host>/<interface>``, ``<host>/<device>``, a process group) and which labels tell its
series apart in ``training.signal`` (``training.qdisc.drops{tbf}``).

``effect`` marks throughput figures (bytes and packets moved, GPU utilisation): they fall
whenever steps slow down, whatever the cause, so when they change in the same sampling
interval as a cause-type signal (drops, latency, throttling) they are ordered after it.

``worse`` is the direction in which a signal hurts: drops, errors, backlog, latency and
throttling up, the SM clock down. A change the other way (a qdisc's overlimits falling
because less traffic comes) cannot explain a slower step: it is an effect too. ``0``: either
way can hurt (a volume's reads falling because it is throttled, or rising because something
else reads it).

``floor_per_step``: the least a counter must count per query step on one side of a change
for the change to matter: one event for counters of discrete events (drops, errors,
retransmits; a retransmit now and then is no sustained change, however large the ratio from
zero), one 4 KiB block for byte counters of storage. ``observations`` is, for a signal in
seconds per observation (the data loader's wait per batch, a collective's transfer), the
rate of its observations: with the job's step rate it says how many a step has, so a shift
can be compared with the step time's rise (``Settings.material_fraction``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from skewtrace import semconv
from skewtrace.timeline.source import Form, Query

label = semconv.prometheus_label

JOB = label(semconv.JOB_ID)
RANK = label(semconv.RANK)
HOST = label(semconv.HOST_NAME)
SWITCH = label(semconv.SWITCH)
PG = label(semconv.COLLECTIVE_PG)
OP = label(semconv.COLLECTIVE_OP)
IFACE = label(semconv.NETWORK_INTERFACE)
NET_DIRECTION = label(semconv.NETWORK_DIRECTION)
DEVICE = label(semconv.SYSTEM_DEVICE)
DISK_DIRECTION = label(semconv.DISK_DIRECTION)
QDISC_KIND = label(semconv.QDISC_KIND)
NIC_DEVICE = label(semconv.NIC_DEVICE)
NIC_COUNTER = label(semconv.NIC_COUNTER)
NIC_SIGNAL = label(semconv.NIC_SIGNAL)
GPU_UUID = label(semconv.GPU_UUID)
THROTTLE_REASON = label(semconv.GPU_THROTTLE_REASON)
ERROR_TYPE = label(semconv.ERROR_TYPE)

Labels = Mapping[str, str]


def _get(labels: Labels, key: str) -> str:
    return labels.get(key) or semconv.UNKNOWN


def on_host(*keys: str) -> Callable[[Labels], str]:
    """``<host>/<value of the first key present>`` (``node3/eth0``)."""

    def name(labels: Labels) -> str:
        part = next((labels[k] for k in keys if labels.get(k)), semconv.UNKNOWN)
        return f"{_get(labels, HOST)}/{part}"

    return name


def host_only(labels: Labels) -> str:
    return _get(labels, HOST)


def rank_on_host(labels: Labels) -> str:
    """``<host>/rank<r>``: a rank's own figures (its data loader, its process's I/O)."""
    return f"{_get(labels, HOST)}/rank{_get(labels, RANK)}"


def process_group(labels: Labels) -> str:
    return _get(labels, PG)


@dataclass(frozen=True)
class Signal:
    """One metric the timeline watches."""

    name: str
    """Its OTel name, the start of ``training.signal``."""
    query: Query
    kind: str
    """The ``training.component.kind`` a change in it points at."""
    component: Callable[[Labels], str]
    detail: tuple[str, ...] = ()
    """Labels whose values go in braces after the name."""
    per_host: bool = True
    """Read only on the hosts of the regressed ranks (False: on all the job's series: its
    process groups' transfers, its ranks' data-loader waits)."""
    effect: bool = False
    """A throughput figure (see the module doc)."""
    worse: int = 0
    """+1: up hurts, -1: down hurts, 0: either (see the module doc)."""
    floor_per_step: float = 0.0
    """The least it must count per query step on one side of a change (module doc)."""
    observations: Query | None = None
    """For seconds per observation: the rate of the observations (module doc)."""

    worse_when: tuple[tuple[str, str, int], ...] = ()
    """(label, value, direction): where a series has that label value, that direction hurts
    instead of :attr:`worse` (a volume's writes: only more of them can hurt the job's reads)."""

    def worse_direction(self, labels: Labels | None = None) -> int:
        """The direction that hurts for the series with ``labels`` (0: either)."""
        worse = self.worse
        for key, value, direction in self.worse_when:
            if labels is not None and labels.get(key) == value:
                worse = direction
        return worse

    def is_effect(self, before: float, after: float, labels: Labels | None = None) -> bool:
        """Whether a change from ``before`` to ``after`` (of the series with ``labels``) is an
        effect, not a cause."""
        worse = self.worse_direction(labels)
        return self.effect or (worse != 0 and (after - before) * worse <= 0)

    def signal_name(self, labels: Labels) -> str:
        values = [labels[k] for k in self.detail if labels.get(k)]
        return f"{self.name}{{{','.join(values)}}}" if values else self.name


def _rate(
    name: str,
    metric: str,
    kind: str,
    component: Callable[[Labels], str],
    *detail: str,
    effect: bool = False,
    worse: int = 0,
    floor: float = 0.0,
    worse_when: tuple[tuple[str, str, int], ...] = (),
) -> Signal:
    """A counter, read as its per-second rate; ``floor``: :attr:`Signal.floor_per_step`."""
    return Signal(
        name, Query(metric, Form.RATE), kind, component, detail,
        effect=effect, worse=worse, floor_per_step=floor, worse_when=worse_when,
    )  # fmt: skip


def _gauge(
    name: str,
    metric: str,
    kind: str,
    component: Callable[[Labels], str],
    *detail: str,
    effect: bool = False,
    worse: int = 0,
) -> Signal:
    """A gauge, read as sampled."""
    return Signal(
        name, Query(metric, Form.GAUGE), kind, component, detail, effect=effect, worse=worse
    )


sc = semconv
UP, DOWN = 1, -1
EVENT = 1.0
"""One event per query step."""
BLOCK = 4096.0
"""One block of storage per query step."""
WRITES_UP = ((DISK_DIRECTION, semconv.DIRECTION_WRITE, UP),)
"""Fewer writes cannot slow anything; more can (they contend with the job's reads)."""
NIC = sc.COMPONENT_NIC
DISK = sc.COMPONENT_DISK
GPU = sc.COMPONENT_GPU
nic_name = on_host(IFACE)
disk_name = on_host(DEVICE)
gpu_name = on_host(GPU_UUID)

SIGNALS: tuple[Signal, ...] = (
    # A host's network interface and its qdisc.
    _rate(sc.METRIC_QDISC_DROPS, sc.PROM_QDISC_DROPS, NIC, nic_name, QDISC_KIND, worse=UP,
          floor=EVENT),
    _rate(sc.METRIC_QDISC_OVERLIMITS, sc.PROM_QDISC_OVERLIMITS, NIC, nic_name, QDISC_KIND,
          worse=UP, floor=EVENT),
    _gauge(sc.METRIC_QDISC_BACKLOG, sc.PROM_QDISC_BACKLOG, NIC, nic_name, QDISC_KIND, worse=UP),
    _gauge(sc.METRIC_QDISC_RATE, sc.PROM_QDISC_RATE, NIC, nic_name, QDISC_KIND, worse=DOWN),
    _rate(sc.METRIC_NETWORK_ERRORS, sc.PROM_NETWORK_ERRORS, NIC, nic_name, NET_DIRECTION,
          worse=UP, floor=EVENT),
    _rate(sc.METRIC_NETWORK_DROPPED, sc.PROM_NETWORK_DROPPED, NIC, nic_name, NET_DIRECTION,
          worse=UP, floor=EVENT),
    # The link's negotiated speed: a NIC that trained down to a lower rate (the real-NIC
    # counterpart of a shaped qdisc's rate).
    _gauge(sc.METRIC_NETWORK_SPEED, sc.PROM_NETWORK_SPEED, NIC, nic_name, worse=DOWN),
    _rate(sc.METRIC_NETWORK_IO, sc.PROM_NETWORK_IO, NIC, nic_name, NET_DIRECTION, effect=True),
    _rate(sc.METRIC_NETWORK_PACKETS, sc.PROM_NETWORK_PACKETS, NIC, nic_name, NET_DIRECTION,
          effect=True),
    # Port counters mix errors, waits and data; a counter that falls is not worse (data moved
    # falls with every slowdown), and "one per step" holds for ticks and bytes alike.
    _rate(sc.METRIC_NIC_PORT_COUNTER, sc.PROM_NIC_PORT_COUNTER, NIC, on_host(NIC_DEVICE),
          NIC_SIGNAL, NIC_COUNTER, worse=UP, floor=EVENT),
    # The host's TCP stack.
    _rate(sc.METRIC_TCP_RETRANSMITS, sc.PROM_TCP_RETRANSMITS, sc.COMPONENT_HOST, host_only,
          worse=UP, floor=EVENT),
    # Storage: a host's block devices, a rank's own reads and writes. Time spent up is worse;
    # reads can hurt either way (throttled: fewer; contended: more), writes only up.
    _rate(sc.METRIC_DISK_OPERATION_TIME, sc.PROM_DISK_OPERATION_TIME, DISK, disk_name,
          DISK_DIRECTION, worse=UP),
    _rate(sc.METRIC_DISK_IO, sc.PROM_DISK_IO, DISK, disk_name, DISK_DIRECTION, floor=BLOCK,
          worse_when=WRITES_UP),
    _rate(sc.METRIC_DISK_OPERATIONS, sc.PROM_DISK_OPERATIONS, DISK, disk_name, DISK_DIRECTION,
          floor=EVENT, worse_when=WRITES_UP),
    _rate(sc.METRIC_PROCESS_IO, sc.PROM_PROCESS_IO, DISK, rank_on_host, DISK_DIRECTION,
          floor=BLOCK, worse_when=WRITES_UP),
    # A rank's data loader: seconds waited per batch.
    Signal(
        sc.METRIC_DATALOADER_WAIT,
        Query(sc.PROM_DATALOADER_WAIT, Form.RATIO, sc.PROM_DATALOADER_FETCHES),
        sc.COMPONENT_DATALOADER,
        rank_on_host,
        # A rank's wait for its batches is the job's wait, whichever ranks' step time rose
        # (a data straggler's own step span may not hold its fetch; its peers' do).
        per_host=False,
        worse=UP,
        observations=Query(sc.PROM_DATALOADER_FETCHES, Form.RATE),
    ),
    # A rank's GPU.
    _gauge(sc.METRIC_GPU_THROTTLE, sc.PROM_GPU_THROTTLE, GPU, gpu_name, THROTTLE_REASON,
           worse=UP),
    _gauge(sc.METRIC_GPU_SM_CLOCK, sc.PROM_GPU_SM_CLOCK, GPU, gpu_name, worse=DOWN),
    _gauge(sc.METRIC_GPU_TEMPERATURE, sc.PROM_GPU_TEMPERATURE, GPU, gpu_name, worse=UP),
    _gauge(sc.METRIC_GPU_POWER, sc.PROM_GPU_POWER, GPU, gpu_name),
    _rate(sc.METRIC_GPU_XID, sc.PROM_GPU_XID, GPU, gpu_name, worse=UP),
    _rate(sc.METRIC_GPU_ECC_ERRORS, sc.PROM_GPU_ECC_ERRORS, GPU, gpu_name, ERROR_TYPE,
          worse=UP),
    _gauge(sc.METRIC_GPU_UTILIZATION, sc.PROM_GPU_UTILIZATION, GPU, gpu_name, effect=True),
    _rate(sc.METRIC_GPU_PCIE_IO, sc.PROM_GPU_PCIE_IO, GPU, gpu_name, NET_DIRECTION, effect=True),
    _rate(sc.METRIC_GPU_NVLINK_IO, sc.PROM_GPU_NVLINK_IO, GPU, gpu_name, effect=True),
    # The job's collectives: transfer time per process group.
    Signal(
        sc.METRIC_COLLECTIVE_TRANSFER,
        Query(sc.PROM_COLLECTIVE_TRANSFER, Form.MEAN),
        sc.COMPONENT_COLLECTIVE,
        process_group,
        (OP,),
        per_host=False,
        worse=UP,
        observations=Query(sc.PROM_COLLECTIVE_TRANSFER + "_count", Form.RATE),
    ),
)  # fmt: skip

STEP_TIME = Query(semconv.PROM_STEP_DURATION, Form.MEAN)
"""Each rank's mean step time."""
STEP_COUNT = Query(semconv.PROM_STEP_DURATION + "_count", Form.RAW)
"""Each rank's cumulative step count (the step number at a time)."""

# Among changes in the same sampling interval, which comes first: storage feeds the data
# loader, links and GPUs feed the collectives, everything feeds the step. A block device comes
# before a rank's own reads and writes (they wait for it); throughput figures (effects) come
# after the collectives, the step last.
PRECEDENCE = {
    semconv.COMPONENT_SWITCH: 0,
    semconv.COMPONENT_NIC: 10,
    semconv.COMPONENT_HOST: 10,
    semconv.COMPONENT_DISK: 10,
    semconv.COMPONENT_GPU: 10,
    semconv.COMPONENT_DATALOADER: 20,
    semconv.COMPONENT_COLLECTIVE: 30,
}
PROCESS_IO_PRECEDENCE = 15
EFFECT_PRECEDENCE = 40
STEP_PRECEDENCE = 50


# Series timed by the spans themselves (when the wait or transfer happened); every other
# signal comes from node telemetry, read once per its interval.
SPAN_TIMED_KINDS = frozenset({semconv.COMPONENT_DATALOADER, semconv.COMPONENT_COLLECTIVE})


def sample_lag_s(signal: Signal, telemetry_interval_s: float) -> float:
    """How much later than the change itself the signal's series can show it: one telemetry
    interval for node telemetry (a gauge is read, a counter's total taken, once per interval),
    none for series timed by the spans."""
    return 0.0 if signal.kind in SPAN_TIMED_KINDS else telemetry_interval_s


def precedence(signal: Signal, effect: bool | None = None) -> int:
    """The signal's place among changes of one sampling interval (lower first); ``effect``:
    whether this change of it is an effect (default: whether the signal is a throughput)."""
    if signal.effect if effect is None else effect:
        return EFFECT_PRECEDENCE
    if signal.name == semconv.METRIC_PROCESS_IO:
        return PROCESS_IO_PRECEDENCE
    return PRECEDENCE.get(signal.kind, EFFECT_PRECEDENCE)
