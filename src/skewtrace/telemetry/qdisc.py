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
from typing import NamedTuple

NETLINK_ROUTE = 0
RTM_NEWQDISC = 36
RTM_GETQDISC = 38
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3

TCA_KIND = 1
TCA_STATS = 3
TCA_STATS2 = 7
TCA_STATS_QUEUE = 3

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_TCMSG = struct.Struct("=BxxxiIII")  # family, pad, ifindex, handle, parent, info
_RTATTR = struct.Struct("=HH")  # len, type
_GNET_STATS_QUEUE = struct.Struct("=IIIII")  # qlen, backlog, drops, requeues, overlimits
_TC_STATS = struct.Struct("=QIIIIIII")  # bytes, packets, drops, overlimits, bps, pps, qlen, backlog

RECV_BUFFER = 1 << 16


class QdiscStats(NamedTuple):
    interface: str
    kind: str
    drops: int
    overlimits: int
    backlog: int
    """Bytes queued at the moment of the dump."""


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


def parse_qdisc(payload: bytes) -> tuple[int, str, int, int, int] | None:
    """(ifindex, kind, drops, overlimits, backlog) of one ``RTM_NEWQDISC`` payload (the
    ``struct tcmsg`` and its attributes); None when it carries no statistics."""
    if len(payload) < _TCMSG.size:
        return None
    _family, ifindex, _handle, _parent, _info = _TCMSG.unpack_from(payload, 0)
    attributes = _attributes(payload, _TCMSG.size, len(payload))
    kind = attributes.get(TCA_KIND, b"").split(b"\0", 1)[0].decode(errors="replace")
    stats2 = attributes.get(TCA_STATS2)
    if stats2 is not None:
        queue = _attributes(stats2, 0, len(stats2)).get(TCA_STATS_QUEUE)
        if queue is not None and len(queue) >= _GNET_STATS_QUEUE.size:
            _qlen, backlog, drops, _requeues, overlimits = _GNET_STATS_QUEUE.unpack_from(queue)
            return ifindex, kind, drops, overlimits, backlog
    legacy = attributes.get(TCA_STATS)
    if legacy is not None and len(legacy) >= _TC_STATS.size:
        _bytes, _packets, drops, overlimits, _bps, _pps, _qlen, backlog = _TC_STATS.unpack_from(
            legacy
        )
        return ifindex, kind, drops, overlimits, backlog
    return None


def parse_dump(messages: bytes, seq: int) -> tuple[list[tuple[int, str, int, int, int]], bool]:
    """The qdiscs in one ``recv``'s worth of netlink messages, and whether the dump ended."""
    found: list[tuple[int, str, int, int, int]] = []
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
            rows: list[tuple[int, str, int, int, int]] = []
            done = False
            while not done:
                found, done = parse_dump(sock.recv(RECV_BUFFER), seq)
                rows.extend(found)
        except (OSError, ValueError):
            self.close()  # a half-read dump would answer the next request: start clean
            raise
        totals: dict[tuple[str, str], list[int]] = {}
        names: dict[int, str] = {}
        for ifindex, kind, drops, overlimits, backlog in rows:
            name = names.get(ifindex)
            if name is None:
                try:
                    name = socket.if_indextoname(ifindex)
                except OSError:
                    name = str(ifindex)  # the interface went away during the dump
                names[ifindex] = name
            total = totals.setdefault((name, kind), [0, 0, 0])
            total[0] += drops
            total[1] += overlimits
            total[2] += backlog
        return [QdiscStats(name, kind, *total) for (name, kind), total in totals.items()]

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
