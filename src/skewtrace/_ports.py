"""Free TCP ports on 127.0.0.1 for the processes skewtrace starts itself: the demo's
Collector, Prometheus and pacer, the importer's Collector, the tests' and benchmarks'.

A port from ``bind(0)`` comes from the kernel's ephemeral range, the range it also gives
every outgoing connection on the machine. Between the moment such a port is read and the
moment the child process binds it, any client (a gRPC exporter, a gloo rank, Prometheus
scraping) can be handed it for its own end, and the child fails with "address already in
use". CI failed that way once (the Collector's Prometheus exporter). So ports here come from
below the ephemeral range, which the kernel never hands out on its own, chosen at random
(independent processes rarely pick the same one), never twice by one process, and checked
free by binding them. Where the machine's ephemeral range leaves no room below it, the
kernel's choice is used.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000
"""The lowest port handed out (below it, many well-known services listen)."""
_TORCHRUN_DEFAULT = 29500
_DEFAULT_EPHEMERAL_LOW = 32768
_TRIES = 200

_handed_out: set[int] = set()
_lock = threading.Lock()
_random = random.SystemRandom()


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, outside the ephemeral range where it can."""
    high = _ephemeral_low()
    with _lock:
        if high - _LOWEST >= 1000:
            for _ in range(_TRIES):
                port = _random.randrange(_LOWEST, high)
                if port == _TORCHRUN_DEFAULT or port in _handed_out:
                    continue
                if _bindable(port):
                    _handed_out.add(port)
                    return port
        port = _kernel_port()
        _handed_out.add(port)
        return port
