"""Linux network namespaces, links and qdiscs through ``ip`` and ``tc``, and entering a
namespace from one thread.

Everything here shells out to iproute2 (``ip``, ``tc``) as a person would, so a failure
reads like the command that failed. :func:`entered` switches only the calling thread into
a namespace (``setns(2)``): sockets opened inside the block stay in that namespace, and the
rest of the process (a live view's refresh thread, say) stays where it was.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000


class NetnsError(RuntimeError):
    """An ``ip``/``tc`` command failed, or namespaces cannot be used here."""


def run(args: Sequence[str], *, check: bool = True, timeout_s: float = 20.0) -> str:
    """Run one command; on failure raise :class:`NetnsError` with the command and stderr."""
    try:
        proc = subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(args)}: {exc}") from None
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used on this machine (``None`` when they can): not root,
    no ``ip``/``tc``, or the kernel refuses a namespace, a veth pair or a tbf qdisc."""
    if os.geteuid() != 0:
        return "not running as root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} (iproute2) is not installed"
    probe = f"stprobe{os.getpid()}"
    try:
        run(["ip", "netns", "add", probe])
        try:
            run(["ip", "-n", probe, "link", "add", "pa", "type", "veth", "peer", "name", "pb"])
            run(["ip", "-n", probe, "link", "add", "br0", "type", "bridge"])
            run(["tc", "-n", probe, "qdisc", "add", "dev", "pa", "root", "tbf", "rate",
                 "10mbit", "burst", "32kb", "latency", "50ms"])  # fmt: skip
        finally:
            run(["ip", "netns", "del", probe], check=False)
    except NetnsError as exc:
        return f"the kernel refused a namespace, veth, bridge or tbf qdisc ({exc})"
    return None


def list_namespaces() -> list[str]:
    out = run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


LOOPBACK_MTU = 16384
"""The loopback MTU of every namespace made here. A node's TCP send buffer is at most 64 KiB
(``fabric.TCP_SEND_BUFFER``), one segment at the kernel's loopback MTU of 65536: TCP between
two ranks of one node then moved a segment per delayed acknowledgement, 44 to 176 ms per
256 KiB sent (measured here; 5.5 ms to another node at 400 Mbit/s). At 16384 four segments
fit in the buffer and such a send takes 0.1 ms."""


def add_namespace(name: str) -> None:
    run(["ip", "netns", "add", name])
    run(["ip", "-n", name, "link", "set", "lo", "mtu", str(LOOPBACK_MTU), "up"])


def delete_namespace(name: str) -> None:
    """Delete a namespace (its interfaces go with it; veth peers elsewhere too)."""
    run(["ip", "netns", "del", name], check=False)


def pids_in(name: str) -> list[int]:
    out = run(["ip", "netns", "pids", name], check=False)
    return [int(p) for p in out.split() if p.isdigit()]


@contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the block's socket calls in namespace ``name`` (this thread only)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(NETNS_DIR / name, os.O_RDONLY)
        try:
            if libc.setns(target, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise NetnsError(f"setns({name}): {os.strerror(err)}")
        finally:
            os.close(target)
        try:
            yield
        finally:
            if libc.setns(original, CLONE_NEWNET) != 0:  # pragma: no cover - kernel refusal
                err = ctypes.get_errno()
                raise NetnsError(f"setns back from {name}: {os.strerror(err)}")
    finally:
        os.close(original)


MAX_QUEUED_PACKET = 2 * 65536
"""At least a GSO packet (veth's ``gso_max_size`` is 64 KiB) with room to spare. A tbf holds
packets of up to its burst; a rate change keeps the queue, and a queued packet larger than
the new burst can never leave: the link stalls for good (seen: 800 to 100 Mbit/s wedged a job
mid-collective). So no burst is smaller than this."""


def tbf_args(rate_mbit: float) -> list[str]:
    """A token bucket at ``rate_mbit``: a burst of a few packets (at least a 4 ms worth, as
    tbf needs rate/HZ, and at least :data:`MAX_QUEUED_PACKET`) and up to 50 ms of queue
    before drops, like a switch port buffer."""
    burst = _burst_bytes(rate_mbit)
    return ["tbf", "rate", f"{rate_mbit:g}mbit", "burst", str(burst), "latency", "50ms"]


def _burst_bytes(rate_mbit: float) -> int:
    """A shaper's burst at ``rate_mbit``: 4 ms worth, and at least :data:`MAX_QUEUED_PACKET`."""
    return max(MAX_QUEUED_PACKET, int(rate_mbit * 1e6 / 8 * 0.004))


def set_rate(namespace: str, device: str, rate_mbit: float | None) -> None:
    """Shape ``device``'s egress to ``rate_mbit`` (``None``: remove the shaping)."""
    if rate_mbit is None:
        run(["tc", "-n", namespace, "qdisc", "del", "dev", device, "root"], check=False)
        return
    run(["tc", "-n", namespace, "qdisc", "replace", "dev", device, "root", *tbf_args(rate_mbit)])


def set_fair_rate(namespace: str, device: str, rate_mbit: float, sources: Sequence[str]) -> None:
    """Shape ``device``'s egress to ``rate_mbit`` shared fairly among ``sources`` (IPv4
    addresses): an htb class each, guaranteed an equal share and borrowing the whole rate
    while the others are idle (processor sharing between senders, as a fabric whose
    congestion control gives each flow its fair rate), each with a tail-drop queue of 50 ms
    at the full rate, as :func:`tbf_args`. Traffic from other addresses shares a class of its
    own. Replaces whatever shaping the device had."""
    if not sources:
        raise ValueError("fair sharing needs at least one source address")
    run(["tc", "-n", namespace, "qdisc", "del", "dev", device, "root"], check=False)
    burst = str(_burst_bytes(rate_mbit))
    queue = str(max(2 * MAX_QUEUED_PACKET, int(rate_mbit * 1e6 / 8 * 0.050)))
    classes = len(sources) + 1  # the last one: any other sender
    share = f"{rate_mbit / classes:g}mbit"
    tc = ["tc", "-n", namespace]
    run([*tc, "qdisc", "add", "dev", device, "root", "handle", "1:", "htb",
         "default", f"{10 + len(sources):x}"])  # fmt: skip
    run([*tc, "class", "add", "dev", device, "parent", "1:", "classid", "1:1", "htb",
         "rate", f"{rate_mbit:g}mbit", "burst", burst, "cburst", burst])  # fmt: skip
    for k in range(classes):
        classid = f"1:{10 + k:x}"
        # A quantum of a GSO packet: htb's round robin then moves whole packets in turn.
        run([*tc, "class", "add", "dev", device, "parent", "1:1", "classid", classid, "htb",
             "rate", share, "ceil", f"{rate_mbit:g}mbit", "burst", burst, "cburst", burst,
             "quantum", str(MAX_QUEUED_PACKET // 2)])  # fmt: skip
        run([*tc, "qdisc", "add", "dev", device, "parent", classid, "bfifo", "limit", queue])
    for k, source in enumerate(sources):
        run([*tc, "filter", "add", "dev", device, "parent", "1:", "protocol", "ip", "prio",
             "1", "u32", "match", "ip", "src", f"{source}/32", "flowid",
             f"1:{10 + k:x}"])  # fmt: skip


def qdisc_stats(namespace: str, device: str) -> dict[str, int]:
    """Sent bytes, drops and overlimits of ``device``'s root qdisc (zeros when none)."""
    out = run(["tc", "-n", namespace, "-s", "qdisc", "show", "dev", device], check=False)
    # The root's block only: a shaped device's child qdiscs follow it (``parent 1:...``).
    blocks = [b for b in out.split("qdisc ") if b.strip()]
    out = "qdisc " + blocks[0] if blocks else ""
    stats = {"bytes": 0, "packets": 0, "dropped": 0, "overlimits": 0}
    words = out.replace(",", " ").replace("(", " ").replace(")", " ").split()
    for i, word in enumerate(words[:-1]):
        if word == "Sent" and words[i + 1].isdigit():
            stats["bytes"] = int(words[i + 1])
            if i + 3 < len(words) and words[i + 3].isdigit():
                stats["packets"] = int(words[i + 3])
        elif word in ("dropped", "overlimits") and words[i + 1].isdigit():
            stats[word] = int(words[i + 1])
    return stats
