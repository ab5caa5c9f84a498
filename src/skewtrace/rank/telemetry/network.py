"""The node's network counters from files: interfaces, RDMA ports, TCP retransmits.

Each reader takes the root that ``/proc`` and ``/sys`` hang under (``/`` in production, a
fake tree in tests) and returns plain values; turning them into metrics is
:mod:`skewtrace.rank.telemetry.node`'s job. A value that cannot be parsed is left out and reported
through ``on_bad`` (a name saying which file), so one garbled file costs one series, not the
whole source.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

from skewtrace import semconv

OnBad = Callable[[str], None]

INTERFACE_STATISTICS = ("bytes", "packets", "errors", "dropped")
"""The per-direction files of ``/sys/class/net/<if>/statistics`` that are read
(``rx_bytes``, ``tx_bytes``, ...)."""

LOOPBACK = "lo"


def read_int(path: str) -> int:
    with open(path, "rb") as file:
        return int(file.read())


class InterfaceCounters(NamedTuple):
    interface: str
    direction: str
    """``semconv.DIRECTION_RECEIVE`` or ``semconv.DIRECTION_TRANSMIT``."""
    statistic: str
    """One of :data:`INTERFACE_STATISTICS`."""
    value: int


def read_interfaces(root: str, on_bad: OnBad) -> list[InterfaceCounters]:
    """Every interface's counters but the loopback's (its traffic never leaves the node)."""
    base = os.path.join(root, "sys/class/net")
    found: list[InterfaceCounters] = []
    for interface in sorted(os.listdir(base)):
        if interface == LOOPBACK:
            continue
        statistics = os.path.join(base, interface, "statistics")
        if not os.path.isdir(statistics):
            continue  # bonding_masters and other plain files
        for prefix, direction in (
            ("rx", semconv.DIRECTION_RECEIVE),
            ("tx", semconv.DIRECTION_TRANSMIT),
        ):
            for statistic in INTERFACE_STATISTICS:
                path = os.path.join(statistics, f"{prefix}_{statistic}")
                try:
                    value = read_int(path)
                except (OSError, ValueError):
                    on_bad(path)
                    continue
                found.append(InterfaceCounters(interface, direction, statistic, value))
    return found


def read_link_speeds(root: str) -> list[tuple[str, float]]:
    """(interface, bytes per second) of every interface but the loopback that reports a link
    speed (``/sys/class/net/<if>/speed``, Mbit/s). An interface that is down, or virtual
    without a speed, refuses the read or reports -1: it is left out, not counted as bad input
    (that is what such interfaces do)."""
    base = os.path.join(root, "sys/class/net")
    found: list[tuple[str, float]] = []
    for interface in sorted(os.listdir(base)):
        if interface == LOOPBACK or not os.path.isdir(os.path.join(base, interface, "statistics")):
            continue
        try:
            mbit = read_int(os.path.join(base, interface, "speed"))
        except (OSError, ValueError):
            continue
        if mbit > 0:
            found.append((interface, mbit * 1e6 / 8))
    return found


# ------------------------------------------------------------------ RDMA port counters

_SIGNAL_BY_COUNTER = {
    # Physical link trouble: the port's link flapped or saw corrupted symbols.
    "symbol_error": semconv.NIC_SIGNAL_LINK_ERROR,
    "link_error_recovery": semconv.NIC_SIGNAL_LINK_ERROR,
    "link_downed": semconv.NIC_SIGNAL_LINK_ERROR,
    "local_link_integrity_errors": semconv.NIC_SIGNAL_LINK_ERROR,
    "excessive_buffer_overrun_errors": semconv.NIC_SIGNAL_LINK_ERROR,
    "rx_icrc_encapsulated": semconv.NIC_SIGNAL_RECEIVE_ERROR,
    "port_rcv_errors": semconv.NIC_SIGNAL_RECEIVE_ERROR,
    "port_rcv_remote_physical_errors": semconv.NIC_SIGNAL_RECEIVE_ERROR,
    "port_rcv_constraint_errors": semconv.NIC_SIGNAL_DISCARD,
    "port_rcv_switch_relay_errors": semconv.NIC_SIGNAL_DISCARD,
    "port_xmit_discards": semconv.NIC_SIGNAL_DISCARD,
    "port_xmit_constraint_errors": semconv.NIC_SIGNAL_DISCARD,
    "VL15_dropped": semconv.NIC_SIGNAL_DISCARD,
    "out_of_buffer": semconv.NIC_SIGNAL_DISCARD,
    "port_xmit_wait": semconv.NIC_SIGNAL_XMIT_WAIT,
    # Transport-level recovery (RC QPs): what makes a RoCE collective slow without errors.
    "local_ack_timeout_err": semconv.NIC_SIGNAL_RETRANSMIT,
    "out_of_sequence": semconv.NIC_SIGNAL_RETRANSMIT,
    "packet_seq_err": semconv.NIC_SIGNAL_RETRANSMIT,
    "implied_nak_seq_err": semconv.NIC_SIGNAL_RETRANSMIT,
    "duplicate_request": semconv.NIC_SIGNAL_RETRANSMIT,
    "rnr_nak_retry_err": semconv.NIC_SIGNAL_RETRANSMIT,
    "roce_adp_retrans": semconv.NIC_SIGNAL_RETRANSMIT,
    "roce_adp_retrans_to": semconv.NIC_SIGNAL_RETRANSMIT,
    "roce_slow_restart": semconv.NIC_SIGNAL_RETRANSMIT,
    # ECN marks and congestion notification packets (DCQCN).
    "np_ecn_marked_roce_packets": semconv.NIC_SIGNAL_CONGESTION,
    "np_cnp_sent": semconv.NIC_SIGNAL_CONGESTION,
    "rp_cnp_handled": semconv.NIC_SIGNAL_CONGESTION,
    "rp_cnp_ignored": semconv.NIC_SIGNAL_CONGESTION,
    "port_xmit_data": semconv.NIC_SIGNAL_TRAFFIC,
    "port_rcv_data": semconv.NIC_SIGNAL_TRAFFIC,
    "port_xmit_packets": semconv.NIC_SIGNAL_TRAFFIC,
    "port_rcv_packets": semconv.NIC_SIGNAL_TRAFFIC,
    "unicast_xmit_packets": semconv.NIC_SIGNAL_TRAFFIC,
    "unicast_rcv_packets": semconv.NIC_SIGNAL_TRAFFIC,
    "multicast_xmit_packets": semconv.NIC_SIGNAL_TRAFFIC,
    "multicast_rcv_packets": semconv.NIC_SIGNAL_TRAFFIC,
    "rx_write_requests": semconv.NIC_SIGNAL_TRAFFIC,
    "rx_read_requests": semconv.NIC_SIGNAL_TRAFFIC,
    "rx_atomic_requests": semconv.NIC_SIGNAL_TRAFFIC,
}

NOT_COUNTERS = frozenset({"lifespan"})
"""Files among ``hw_counters`` that hold a setting, not a count (the refresh period, ms)."""

RDMA_COUNTER_DIRS = ("counters", "hw_counters")


def nic_signal(counter: str) -> str:
    """The operational meaning of an RDMA counter file, ``other`` for any not mapped."""
    return _SIGNAL_BY_COUNTER.get(counter, semconv.NIC_SIGNAL_OTHER)


class PortCounter(NamedTuple):
    device: str
    port: int
    counter: str
    value: int


def read_rdma_ports(root: str, on_bad: OnBad) -> list[PortCounter]:
    """Every counter of every port of every RDMA device (InfiniBand and RoCE alike).

    A node without RDMA has no ``/sys/class/infiniband``: that is an empty list, not a
    failure, so the source stays quiet on Ethernet-only nodes.
    """
    base = os.path.join(root, "sys/class/infiniband")
    if not os.path.isdir(base):
        return []
    found: list[PortCounter] = []
    for device in sorted(os.listdir(base)):
        ports = os.path.join(base, device, "ports")
        if not os.path.isdir(ports):
            continue
        for port in sorted(os.listdir(ports)):
            if not port.isdigit():
                continue
            for directory in RDMA_COUNTER_DIRS:
                counters = os.path.join(ports, port, directory)
                if not os.path.isdir(counters):
                    continue
                for counter in sorted(os.listdir(counters)):
                    if counter in NOT_COUNTERS:
                        continue
                    path = os.path.join(counters, counter)
                    try:
                        value = read_int(path)
                    except (OSError, ValueError):
                        on_bad(path)
                        continue
                    found.append(PortCounter(device, int(port), counter, value))
    return found


# ------------------------------------------------------------------ TCP

SNMP_TCP_PREFIX = "Tcp:"
RETRANS_SEGS = "RetransSegs"


def read_tcp_retransmits(root: str) -> int:
    """``RetransSegs`` of the ``Tcp:`` table in ``/proc/net/snmp`` (the reader's namespace).

    The table is a header line of names followed by a line of values; a file without it, or
    with a value that is not a number, raises ValueError.
    """
    path = os.path.join(root, "proc/net/snmp")
    with open(path) as file:
        rows = [line.split() for line in file if line.startswith(SNMP_TCP_PREFIX)]
    if len(rows) < 2:
        raise ValueError(f"{path}: no Tcp table")
    names, values = rows[0][1:], rows[1][1:]
    if len(names) != len(values) or RETRANS_SEGS not in names:
        raise ValueError(f"{path}: no {RETRANS_SEGS} in the Tcp table")
    return int(values[names.index(RETRANS_SEGS)])
