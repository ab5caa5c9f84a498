"""The rank's NIC, first match wins (never raises):

1. ``SKEWTRACE_NIC``;
2. ``NCCL_IB_HCA``, ``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``: the first entry, with
   ``=`` and ``:port`` stripped; exclusion lists (``^...``) name NICs *not* used, so they
   are skipped;
3. the node's ``nic`` in the topology file (passed in as ``file_nic``);
4. the interface whose address routes to ``MASTER_ADDR`` (a UDP socket ``connect`` picks
   the source address without sending anything);
5. ``unknown``.
"""

from __future__ import annotations

import array
import fcntl
import ipaddress
import logging
import os
import socket
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

from skewtrace.semconv import UNKNOWN

_logger = logging.getLogger(__name__)

SKEWTRACE_NIC = "SKEWTRACE_NIC"
"""The rank's NIC; wins over every other source."""

_NIC_ENV_VARS = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _first_nic_entry(value: str, interfaces: Sequence[str]) -> str | None:
    """First NIC of an NCCL/Gloo list; None for an exclusion list or an empty value."""
    value = value.strip()
    if not value or value.startswith("^"):
        return None
    exact = value.startswith("=")
    first = value.lstrip("=").split(",")[0].strip()
    # NCCL_IB_HCA entries may carry a port: mlx5_0:1.
    first = first.split(":")[0].strip()
    if not first:
        return None
    if exact or first in interfaces:
        return first
    # NCCL treats a plain entry as a prefix (eth -> eth0, eth1...): name the real interface.
    matches = sorted(name for name in interfaces if name.startswith(first))
    return matches[0] if matches else first


def _interface_names() -> list[str]:
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:
        return []


_SIOCGIFADDR = 0x8915
_SIOCGIFFLAGS = 0x8913
_IFF_LOOPBACK = 0x8


def _ioctl_ifreq(sock: socket.socket, request: int, name: str) -> bytes:
    ifreq = array.array("B", struct.pack("256s", name.encode()[:15]))
    fcntl.ioctl(sock.fileno(), request, ifreq)
    return ifreq.tobytes()


def _ipv4_interface(address: str, interfaces: Sequence[str]) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in interfaces:
            try:
                ifreq = _ioctl_ifreq(sock, _SIOCGIFADDR, name)
            except OSError:
                continue  # no IPv4 address on this interface
            if socket.inet_ntoa(ifreq[20:24]) == address:
                return name
    return None


def _ipv6_interface(address: str, if_inet6: str = "/proc/net/if_inet6") -> str | None:
    wanted = ipaddress.IPv6Address(address).exploded.replace(":", "")
    try:
        lines = Path(if_inet6).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[0] == wanted:
            return fields[5]
    return None


def _route_interface(destination: str, route_table: str = "/proc/net/route") -> str | None:
    """Longest-prefix match of an IPv4 destination in the kernel's main route table."""
    try:
        lines = Path(route_table).read_text().splitlines()[1:]
    except OSError:
        return None
    target = struct.unpack("<I", socket.inet_aton(destination))[0]
    best: tuple[int, str] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        network, mask = int(fields[1], 16), int(fields[7], 16)
        if target & mask == network:
            prefix = bin(mask).count("1")
            if best is None or prefix > best[0]:
                best = (prefix, fields[0])
    return best[1] if best else None


def _loopback_interface(interfaces: Sequence[str]) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in interfaces:
            try:
                flags = struct.unpack("H", _ioctl_ifreq(sock, _SIOCGIFFLAGS, name)[16:18])[0]
            except OSError:
                continue
            if flags & _IFF_LOOPBACK:
                return name
    return "lo"


def _nic_towards(host: str, port: int, interfaces: Sequence[str]) -> str | None:
    """The interface whose address the kernel picks to reach host:port."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    # Prefer IPv4: that is what torch's rendezvous uses for a name with both families.
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect(sockaddr)  # UDP connect only picks a route; no packet leaves
        local = sock.getsockname()[0]
    source = ipaddress.ip_address(local.split("%")[0])
    if isinstance(source, ipaddress.IPv4Address):
        name = _ipv4_interface(str(source), interfaces) or _route_interface(str(sockaddr[0]))
    else:
        name = _ipv6_interface(str(source))
    if name is None and source.is_loopback:
        name = _loopback_interface(interfaces)
    return name


def discover_nic(env: Mapping[str, str] | None = None, *, file_nic: str | None = None) -> str:
    """The rank's NIC name, or ``unknown``; never raises (in the order above)."""
    environ: Mapping[str, str] = os.environ if env is None else env
    try:
        explicit = environ.get(SKEWTRACE_NIC, "").strip()
        if explicit:
            return explicit
        interfaces = _interface_names()
        for name in _NIC_ENV_VARS:
            nic = _first_nic_entry(environ.get(name, ""), interfaces)
            if nic:
                return nic
        if file_nic:
            return file_nic
        master = environ.get("MASTER_ADDR", "").strip()
        if master:
            port_text = environ.get("MASTER_PORT", "").strip()
            port = int(port_text) if port_text.isdigit() else 29500
            nic = _nic_towards(master, port, interfaces)
            if nic:
                return nic
    except Exception as error:  # a NIC name is never worth failing training over
        _logger.debug("skewtrace: NIC discovery failed: %r", error)
    return UNKNOWN
