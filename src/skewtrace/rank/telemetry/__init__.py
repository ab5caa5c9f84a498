"""Node telemetry as OpenTelemetry metrics, sampled from inside the training process.

What a rank's spans cannot say (the NIC dropped packets, the qdisc was over its rate, the
GPU throttled, the disk was slow) is sampled here, every
``SKEWTRACE_NODE_TELEMETRY_INTERVAL_MILLIS`` (1000), so that it lands on the same timeline
and carries the same rank labels as the spans:

- local rank 0 of each node: ``system.network.*`` per interface (``/sys/class/net``),
  ``training.nic.port.counter`` per RDMA port counter (``/sys/class/infiniband``),
  ``training.tcp.retransmits`` (``/proc/net/snmp``), ``training.qdisc.*`` (rtnetlink),
  ``system.disk.*`` per block device (``/proc/diskstats``);
- every rank: ``training.process.io`` (``/proc/self/io`` plus its data-loader workers),
  ``training.dataloader.wait`` / ``.fetches`` (from its ``dataloader.fetch`` events), and
  the ``hw.gpu.*`` / ``training.gpu.*`` figures of its own GPU through NVML (``pynvml``,
  the ``gpu`` extra), when the resource has a ``gpu.uuid``.

``skewtrace.instrument()`` starts it with the instrumentation and stops it with
``uninstrument()``. ``SKEWTRACE_NODE_TELEMETRY=off`` turns it off;
``SKEWTRACE_NODE_TELEMETRY_ROOT`` reads ``proc/`` and ``sys/`` under another directory.
Metrics go to the ``meter_provider`` given to ``instrument()`` (or a global SDK one), else to
a private MeterProvider with the rank's resource and an OTLP exporter. A source that fails is
skipped and counted, never raised. ``docs/telemetry.md`` has the details and the cost.
"""

from skewtrace.rank.telemetry.dataloader import FetchCountingRecorder
from skewtrace.rank.telemetry.node import NodeTelemetry

__all__ = ["FetchCountingRecorder", "NodeTelemetry"]
