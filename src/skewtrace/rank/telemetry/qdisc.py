"""Queueing-discipline statistics over rtnetlink: one ``RTM_GETQDISC`` dump per sample.

``tc -s -j qdisc show`` prints the same figures, but spawning it every second costs a fork
and exec of a program that then does this very dump; reading the dump here costs one
``recv`` or two and a little ``struct`` unpacking. The figures are the kernel's
``struct gnet_stats_queue`` (``TCA_STATS2``/``TCA_STATS_QUEUE``), with the older
``struct tc_stats`` (``TCA_STATS``) as a fallback. Statistics are per network namespace: the
dump shows the qdiscs of the namespace the calling thread is in.

Interface names come from ``if_indextoname`` (an ioctl in the same namespace as the dump),
not from ``/sys/class/net``: a process that entered a namespace with ``setns`` alone still
sees the old namespace's ``/sys``.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import NamedTuple

NETLINK_ROUTE = 0
RTM_NEWQDISC = 36
RTM_GETQDISC = 38
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3

TCA_KIND = 1
TCA_OPTIONS = 2
TCA_STATS = 3
TCA_STATS2 = 7
TCA_STATS_QUEUE = 3
TCA_TBF_PARMS = 1
TCA_TBF_RATE64 = 4

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_TCMSG = struct.Struct("=BxxxiIII")  # family, pad, ifindex, handle, parent, info
_RTATTR = struct.Struct("=HH")  # len, type
_GNET_STATS_QUEUE = struct.Struct("=IIIII")  # qlen, backlog, drops, requeues, overlimits
_TC_STATS = struct.Struct("=QIIIIIII")  # bytes, packets, drops, overlimits, bps, pps, qlen, backlog

_TC_RATESPEC = struct.Struct("=BBHhHI")  # cell_log, linklayer, overhead, cell_align, mpu, rate
_U64 = struct.Struct("=Q")

RECV_BUFFER = 1 << 16


class QdiscStats(NamedTuple):
    interface: str
    kind: str
    drops: int
    overlimits: int
    backlog: int
    """Bytes queued at the moment of the dump (:class:`BacklogAverager`: the mean over the
    interval)."""
    rate: int = 0
    """The rate a shaping qdisc (tbf) holds the interface to, in bytes per second; 0 for a
    qdisc without one. A link that trained down to a lower speed shows as this falling where
    the link is shaped (the emulated fabric's NICs are)."""


def _align(length: int) -> int:
    return (length + 3) & ~3


def _attributes(data: bytes, offset: int, end: int) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    while offset + _RTATTR.size <= end:
        length, kind = _RTATTR.unpack_from(data, offset)
        if length < _RTATTR.size or offset + length > end:
            break
        # The top bits flag nested/byte-order attributes; the type is the low 14.
        found[kind & 0x3FFF] = data[offset + _RTATTR.size : offset + length]
        offset += _align(length)
    return found


Row = tuple[int, str, int, int, int, int]
"""(ifindex, kind, drops, overlimits, backlog, rate) of one qdisc."""


def tbf_rate(options: bytes) -> int:
    """A tbf's rate in bytes per second from its ``TCA_OPTIONS`` (``TCA_TBF_RATE64`` when
    the rate needs 64 bits, else ``struct tc_tbf_qopt``'s ``rate.rate``); 0 if absent."""
    nested = _attributes(options, 0, len(options))
    rate64 = nested.get(TCA_TBF_RATE64)
    if rate64 is not None and len(rate64) >= _U64.size:
        return int(_U64.unpack_from(rate64)[0])
    parms = nested.get(TCA_TBF_PARMS)
    if parms is not None and len(parms) >= _TC_RATESPEC.size:
        return int(_TC_RATESPEC.unpack_from(parms)[5])
    return 0


def parse_qdisc(payload: bytes) -> Row | None:
    """(ifindex, kind, drops, overlimits, backlog, rate) of one ``RTM_NEWQDISC`` payload (the
    ``struct tcmsg`` and its attributes); None when it carries no statistics."""
    if len(payload) < _TCMSG.size:
        return None
    _family, ifindex, _handle, _parent, _info = _TCMSG.unpack_from(payload, 0)
    attributes = _attributes(payload, _TCMSG.size, len(payload))
    kind = attributes.get(TCA_KIND, b"").split(b"\0", 1)[0].decode(errors="replace")
    options = attributes.get(TCA_OPTIONS)
    rate = tbf_rate(options) if kind == "tbf" and options is not None else 0
    stats2 = attributes.get(TCA_STATS2)
    if stats2 is not None:
        queue = _attributes(stats2, 0, len(stats2)).get(TCA_STATS_QUEUE)
        if queue is not None and len(queue) >= _GNET_STATS_QUEUE.size:
            _qlen, backlog, drops, _requeues, overlimits = _GNET_STATS_QUEUE.unpack_from(queue)
            return ifindex, kind, drops, overlimits, backlog, rate
    legacy = attributes.get(TCA_STATS)
    if legacy is not None and len(legacy) >= _TC_STATS.size:
        _bytes, _packets, drops, overlimits, _bps, _pps, _qlen, backlog = _TC_STATS.unpack_from(
            legacy
        )
        return ifindex, kind, drops, overlimits, backlog, rate
    return None


def parse_dump(messages: bytes, seq: int) -> tuple[list[Row], bool]:
    """The qdiscs in one ``recv``'s worth of netlink messages, and whether the dump ended."""
    found: list[Row] = []
    offset = 0
    while offset + _NLMSGHDR.size <= len(messages):
        length, kind, _flags, message_seq, _pid = _NLMSGHDR.unpack_from(messages, offset)
        if length < _NLMSGHDR.size or offset + length > len(messages):
            raise ValueError("truncated netlink message")
        body = messages[offset + _NLMSGHDR.size : offset + length]
        offset += _align(length)
        if message_seq != seq:
            continue  # a late answer to an earlier, abandoned dump
        if kind == NLMSG_DONE:
            return found, True
        if kind == NLMSG_ERROR:
            (error,) = struct.unpack_from("=i", body)
            if error:
                raise OSError(-error, f"RTM_GETQDISC: {os.strerror(-error)}")
            continue
        if kind == RTM_NEWQDISC:
            parsed = parse_qdisc(body)
            if parsed is not None:
                found.append(parsed)
    return found, False


class QdiscReader:
    """Dumps every qdisc of the calling thread's network namespace.

    The socket is opened on first use and kept: it belongs to the namespace it was opened in,
    so a reader must be used from one namespace (a sampler thread is).
    """

    def __init__(self) -> None:
        self._socket: socket.socket | None = None
        self._seq = itertools.count(1)

    def _open(self) -> socket.socket:
        if self._socket is None:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
            sock.settimeout(1.0)
            sock.bind((0, 0))
            self._socket = sock
        return self._socket

    def read(self) -> list[QdiscStats]:
        """Per (interface, kind), the sums over its qdiscs (an ``mq`` root's children are
        ``fq_codel`` one per queue: their sum is the interface's ``fq_codel`` figure)."""
        sock = self._open()
        seq = next(self._seq) & 0xFFFFFFFF
        request = _NLMSGHDR.pack(
            _NLMSGHDR.size + _TCMSG.size, RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, seq, 0
        ) + _TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        try:
            sock.send(request)
            rows: list[Row] = []
            done = False
            while not done:
                found, done = parse_dump(sock.recv(RECV_BUFFER), seq)
                rows.extend(found)
        except (OSError, ValueError):
            self.close()  # a half-read dump would answer the next request: start clean
            raise
        totals: dict[tuple[str, str], list[int]] = {}
        names: dict[int, str] = {}
        for ifindex, kind, drops, overlimits, backlog, rate in rows:
            name = names.get(ifindex)
            if name is None:
                try:
                    name = socket.if_indextoname(ifindex)
                except OSError:
                    name = str(ifindex)  # the interface went away during the dump
                names[ifindex] = name
            total = totals.setdefault((name, kind), [0, 0, 0, 0])
            total[0] += drops
            total[1] += overlimits
            total[2] += backlog
            total[3] += rate
        return [QdiscStats(name, kind, *total) for (name, kind), total in totals.items()]

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


SUBSAMPLES = 10
"""Backlog samples per collection interval."""


class BacklogAverager:
    """The qdisc figures a collection reports, with the backlog averaged over the interval.

    A queue's backlog at one instant says little: a link at its limit empties and fills
    within a step, so one sample a second lands on an empty queue about as often as not. A
    daemon thread of its own samples the backlog :data:`SUBSAMPLES` times an interval;
    :meth:`read` answers the fresh counters with, as backlog, the mean of the samples since
    the previous read (its own included). The reader is used under a lock: one netlink
    socket, one request at a time. A sample that fails is skipped (the collection's own read
    reports failures). Ten dumps a second cost about a millisecond of CPU a second.
    """

    def __init__(self, read: Callable[[], list[QdiscStats]], period_s: float) -> None:
        self._read = read
        self.period_s = period_s
        self._read_lock = threading.Lock()
        self._sums_lock = threading.Lock()
        self._sums: dict[tuple[str, str], list[int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failed_samples = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="skewtrace-qdisc-backlog", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def _locked_read(self) -> list[QdiscStats]:
        with self._read_lock:
            return self._read()

    def sample(self) -> None:
        """One backlog sample (the thread's; tests call it directly)."""
        try:
            rows = self._locked_read()
        except Exception:
            self.failed_samples += 1
            return
        with self._sums_lock:
            for row in rows:
                total = self._sums.setdefault((row.interface, row.kind), [0, 0])
                total[0] += row.backlog
                total[1] += 1

    def read(self) -> list[QdiscStats]:
        """The counters now, the backlog's mean since the previous read (raises as the reader
        does)."""
        rows = self._locked_read()
        with self._sums_lock:
            sums, self._sums = self._sums, {}
        out = []
        for row in rows:
            total, count = sums.get((row.interface, row.kind), (0, 0))
            out.append(row._replace(backlog=round((total + row.backlog) / (count + 1))))
        return out

    def close(self, timeout_s: float = 1.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
