"""Storage counters from files: the node's block devices and the rank's own process tree.

``/proc/diskstats`` counts per block device; only whole devices are kept (a partition's I/O
is already in its disk's), RAM disks are left out. ``/proc/<pid>/io`` counts the bytes a
process made the storage layer read or write; the rank's data-loader workers are its child
processes, so the rank's figure is its own plus its descendants'. Workers come and go (one
set per epoch without ``persistent_workers``), so :class:`ProcessTreeIO` keeps what exited
processes had done and the sum stays a counter.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

SECTOR_BYTES = 512
"""``/proc/diskstats`` counts 512-byte sectors whatever the device's block size."""

RAM_DISK_PREFIX = "ram"


class DiskCounters(NamedTuple):
    device: str
    reads: int
    read_bytes: int
    read_time_s: float
    writes: int
    write_bytes: int
    write_time_s: float


def _whole_devices(root: str) -> set[str] | None:
    """Names under ``/sys/block`` (disks, loop, dm, md; no partitions); None if unreadable."""
    try:
        return set(os.listdir(os.path.join(root, "sys/block")))
    except OSError:
        return None


def read_diskstats(root: str, on_bad: Callable[[str], None]) -> list[DiskCounters]:
    """Whole block devices from ``/proc/diskstats``; a line that does not parse is skipped."""
    path = os.path.join(root, "proc/diskstats")
    whole = _whole_devices(root)
    found: list[DiskCounters] = []
    with open(path) as file:
        for line in file:
            fields = line.split()
            if len(fields) < 14:
                on_bad(path)
                continue
            device = fields[2]
            if device.startswith(RAM_DISK_PREFIX) or (whole is not None and device not in whole):
                continue
            try:
                reads, sectors_read, read_ms = int(fields[3]), int(fields[5]), int(fields[6])
                writes, sectors_written, write_ms = int(fields[7]), int(fields[9]), int(fields[10])
            except ValueError:
                on_bad(path)
                continue
            found.append(
                DiskCounters(
                    device,
                    reads,
                    sectors_read * SECTOR_BYTES,
                    read_ms / 1000.0,
                    writes,
                    sectors_written * SECTOR_BYTES,
                    write_ms / 1000.0,
                )
            )
    return found


class ProcessIO(NamedTuple):
    read_bytes: int
    write_bytes: int


def read_process_io(path: str) -> ProcessIO:
    """``read_bytes`` and ``write_bytes`` of one ``/proc/<pid>/io`` file."""
    values: dict[str, int] = {}
    with open(path) as file:
        for line in file:
            name, _, value = line.partition(":")
            if name in ("read_bytes", "write_bytes"):
                values[name] = int(value)
    if len(values) != 2:
        raise ValueError(f"{path}: no read_bytes/write_bytes")
    return ProcessIO(values["read_bytes"], values["write_bytes"])


def child_pids(root: str, pid: str) -> list[str] | None:
    """Children of ``pid`` from ``/proc/<pid>/task/*/children``; None where the kernel lacks
    that file (CONFIG_PROC_CHILDREN)."""
    tasks = os.path.join(root, "proc", pid, "task")
    children: list[str] = []
    seen_file = False
    try:
        tasks_listed = os.listdir(tasks)
    except FileNotFoundError:
        return []  # the process exited since its parent listed it
    for task in tasks_listed:
        try:
            with open(os.path.join(tasks, task, "children")) as file:
                children.extend(file.read().split())
            seen_file = True
        except FileNotFoundError:
            continue
        except OSError:
            continue  # the thread ended between listdir and open
    return children if seen_file else None


def _children_by_ppid(root: str) -> dict[str, list[str]]:
    """Every process's children, from each ``/proc/<pid>/stat`` (the slow fallback)."""
    proc = os.path.join(root, "proc")
    children: dict[str, list[str]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "stat")) as file:
                stat = file.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        after = stat.rpartition(")")[2].split()
        if len(after) >= 2:
            children.setdefault(after[1], []).append(entry)
    return children


def descendants(root: str, pid: str) -> list[str]:
    """All descendants of ``pid`` (data-loader workers, and any process they started)."""
    found: list[str] = []
    pending = [pid]
    by_ppid: dict[str, list[str]] | None = None
    while pending:
        parent = pending.pop()
        children = None if by_ppid is not None else child_pids(root, parent)
        if children is None:
            if by_ppid is None:
                by_ppid = _children_by_ppid(root)
            children = by_ppid.get(_real_pid(root, parent), [])
        found.extend(children)
        pending.extend(children)
    return found


def _real_pid(root: str, pid: str) -> str:
    if pid != "self":
        return pid
    try:
        return os.readlink(os.path.join(root, "proc/self"))
    except OSError:
        return str(os.getpid())


class ProcessTreeIO:
    """Storage bytes of a process and its descendants, kept monotonic across their exits."""

    def __init__(self, root: str, pid: str = "self") -> None:
        self._root = root
        self._pid = pid
        self._last: dict[str, ProcessIO] = {}
        # What processes that are gone (or whose pid was reused) had done when last seen.
        self._retired = ProcessIO(0, 0)

    def read(self) -> ProcessIO:
        """Cumulative bytes; raises OSError/ValueError only when the process's own file fails."""
        own = read_process_io(os.path.join(self._root, "proc", self._pid, "io"))
        current: dict[str, ProcessIO] = {}
        for child in descendants(self._root, self._pid):
            try:
                current[child] = read_process_io(os.path.join(self._root, "proc", child, "io"))
            except (OSError, ValueError):
                continue  # exited since it was listed; its last reading is retired below
        retired_read, retired_write = self._retired
        for pid, last in self._last.items():
            now = current.get(pid)
            if (
                now is None
                or now.read_bytes < last.read_bytes
                or now.write_bytes < last.write_bytes
            ):
                retired_read += last.read_bytes
                retired_write += last.write_bytes
        self._retired = ProcessIO(retired_read, retired_write)
        self._last = current
        return ProcessIO(
            own.read_bytes + retired_read + sum(io.read_bytes for io in current.values()),
            own.write_bytes + retired_write + sum(io.write_bytes for io in current.values()),
        )
