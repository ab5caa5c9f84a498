"""``checkpoint.save`` and ``checkpoint.load`` spans: every ``torch.save`` / ``torch.load``.

``torch.save`` and ``torch.serialization.save`` are one function, so one wrapper goes on
both attributes (likewise for ``load``) and a call through either is recorded once; a
``torch.save`` that someone else already replaced is left alone (it most likely ends in
``torch.serialization.save``, which is ours). The event is recorded after the call
returns, and also when it raises, whose exception then propagates unchanged. Like a
``dataloader.fetch`` the span belongs to the step in progress: a save right after
``optimizer.step`` is in the next step's ``train.step``, and a load before the first batch
opens step 0.

``training.checkpoint.path_kind`` for a path is the type of the filesystem mounted at the
longest mount point that prefixes the file's directory, symlinks resolved (a file not yet
written, or a failed save, still has a directory), mapped by :func:`path_kind_of_fstype`; a
symlinked file is followed to its target. For a file object it is ``stream``.
``training.checkpoint.bytes`` is the file's size after the call, absent for streams and for
a file that is not there after a failed call. The mount table is parsed once per process and
the kind remembered per directory, so a checkpoint costs one ``lstat`` beyond the call.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
import threading
from collections.abc import Callable, Sequence
from typing import Any

from skewtrace import semconv
from skewtrace.rank._events import CHECKPOINT
from skewtrace.rank._recorder import now_ns
from skewtrace.rank.hooks._context import HookContext
from skewtrace.rank.hooks._patches import Patches

logger = logging.getLogger("skewtrace")

# Values of training.checkpoint.path_kind.
PATH_KIND_LOCAL = "local"
PATH_KIND_NETWORK = "network"
PATH_KIND_MEMORY = "memory"
PATH_KIND_STREAM = "stream"
PATH_KIND_UNKNOWN = "unknown"
PATH_KINDS = frozenset(
    {PATH_KIND_LOCAL, PATH_KIND_NETWORK, PATH_KIND_MEMORY, PATH_KIND_STREAM, PATH_KIND_UNKNOWN}
)

_MEMORY_FSTYPES = frozenset({"tmpfs", "ramfs"})
# 9p counts as network: it is a wire protocol, and where it carries files (WSL2's Windows
# drives, virtio-9p shares into VMs) every access crosses to another kernel.
_NETWORK_FSTYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "ceph",
        "cifs",
        "smb3",
        "smbfs",
        "beegfs",
        "wekafs",
        "panfs",
        "glusterfs",
        "afs",
        "9p",
    }
)
# FUSE subtypes (``fuse.<name>``) that are clients of a remote store.
_NETWORK_FUSE = frozenset(
    {
        "gcsfuse",
        "s3fs",
        "juicefs",
        "goofys",
        "geesefs",
        "mountpoint-s3",
        "blobfuse",
        "blobfuse2",
        "rclone",
        "sshfs",
        "glusterfs",
        "ceph-fuse",
        "alluxio-fuse",
    }
)
# Block-device filesystems; overlay is a container's root, whose upper layer is on local disk,
# and fuseblk is FUSE over a local block device (ntfs-3g).
_LOCAL_FSTYPES = frozenset(
    {
        "ext2",
        "ext3",
        "ext4",
        "xfs",
        "btrfs",
        "zfs",
        "overlay",
        "f2fs",
        "vfat",
        "exfat",
        "ntfs",
        "ntfs3",
        "fuseblk",
    }
)

MOUNTINFO = "/proc/self/mountinfo"
# Directories whose kind is remembered; past this the memo starts over.
_DIRECTORY_CACHE = 1024


def path_kind_of_fstype(fstype: str) -> str:
    """``training.checkpoint.path_kind`` for a filesystem type as ``mountinfo`` spells it."""
    if fstype in _MEMORY_FSTYPES:
        return PATH_KIND_MEMORY
    if fstype in _NETWORK_FSTYPES:
        return PATH_KIND_NETWORK
    if fstype.startswith("fuse."):
        return PATH_KIND_NETWORK if fstype[5:] in _NETWORK_FUSE else PATH_KIND_UNKNOWN
    if fstype in _LOCAL_FSTYPES:
        return PATH_KIND_LOCAL
    return PATH_KIND_UNKNOWN


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as \ooo octal escapes.
    if "\\" not in field:
        return field
    out: list[str] = []
    i = 0
    while i < len(field):
        chunk = field[i + 1 : i + 4]
        if field[i] == "\\" and len(chunk) == 3 and all(c in "01234567" for c in chunk):
            out.append(chr(int(chunk, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """``(mount point, fstype)`` of each line of ``/proc/<pid>/mountinfo``, in file order.

    A line is ``id parent major:minor root mount-point options [optional...] - fstype
    source super-options``; malformed lines are skipped.
    """
    mounts: list[tuple[str, str]] = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        after = tail.split()
        if not sep or len(fields) < 5 or not after:
            continue
        mounts.append((_unescape(fields[4]), after[0]))
    return mounts


def fstype_of(path: str, mounts: Sequence[tuple[str, str]]) -> str | None:
    """The fstype of the mount with the longest mount point that prefixes absolute ``path``;
    of equal mount points the later (it is mounted over the earlier)."""
    best: str | None = None
    best_len = -1
    for point, fstype in mounts:
        if point == "/":
            matches = path.startswith("/")
        else:
            matches = path == point or path.startswith(point + "/")
        if matches and len(point) >= best_len:
            best, best_len = fstype, len(point)
    return best


class PathKinds:
    """Path -> ``training.checkpoint.path_kind``, with the mount table read once."""

    def __init__(self, mountinfo: str = MOUNTINFO) -> None:
        self._mountinfo = mountinfo
        self._mounts: list[tuple[str, str]] | None = None
        self._by_directory: dict[str, str] = {}
        self._lock = threading.Lock()

    def _mount_table(self) -> list[tuple[str, str]]:
        mounts = self._mounts
        if mounts is None:
            try:
                with open(self._mountinfo, encoding="utf-8", errors="surrogateescape") as file:
                    mounts = parse_mountinfo(file.read())
            except OSError:
                mounts = []  # not Linux, or no /proc: every path is unknown
            self._mounts = mounts
        return mounts

    def kind(self, path: str) -> str:
        """The kind of a file in its directory (the file itself may not exist yet)."""
        path = os.path.abspath(path)
        directory = os.path.dirname(path)
        kind = self._by_directory.get(directory)
        if kind is None:
            kind = self.kind_of_resolved(os.path.realpath(directory))
            with self._lock:
                if len(self._by_directory) >= _DIRECTORY_CACHE:
                    self._by_directory.clear()
                self._by_directory[directory] = kind
        return kind

    def kind_of_resolved(self, path: str) -> str:
        """The kind of an absolute path with no symlinks left in it."""
        with self._lock:
            mounts = self._mount_table()
        fstype = fstype_of(path, mounts)
        return PATH_KIND_UNKNOWN if fstype is None else path_kind_of_fstype(fstype)


_PATH_KINDS = PathKinds()


def describe_target(target: Any, kinds: PathKinds = _PATH_KINDS) -> tuple[int | None, str]:
    """``(bytes, path_kind)`` of what ``torch.save``/``load`` was given, after the call.

    One ``lstat`` for a plain file; a symlinked file (``latest.pt`` pointing at the newest
    checkpoint, maybe on another mount) is resolved and its target's mount and size taken.
    """
    if not isinstance(target, (str, os.PathLike)):
        return None, PATH_KIND_STREAM
    path = os.fsdecode(os.fspath(target))
    try:
        info: os.stat_result | None = os.lstat(path)
    except (OSError, ValueError):
        info = None  # not written (a failed save) or not there (a failed load)
    if info is not None and stat.S_ISLNK(info.st_mode):
        resolved = os.path.realpath(path)
        try:
            size: int | None = os.stat(resolved).st_size
        except (OSError, ValueError):
            size = None
        return size, kinds.kind_of_resolved(resolved)
    return (None if info is None else info.st_size), kinds.kind(path)


def _traced(
    ctx: HookContext, original: Callable[..., Any], span_name: str, file_position: int
) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        recorder = ctx.recorder
        if not recorder.active:
            return original(*args, **kwargs)
        start = now_ns()
        try:
            return original(*args, **kwargs)
        finally:
            end = now_ns()
            try:
                target = args[file_position] if len(args) > file_position else kwargs.get("f")
                nbytes, kind = describe_target(target)
            except Exception:
                logger.debug("skewtrace: checkpoint target not described", exc_info=True)
                nbytes, kind = None, PATH_KIND_UNKNOWN
            try:
                recorder.mark_activity(start)
                recorder.record((CHECKPOINT, span_name, recorder.step, start, end, nbytes, kind))
            except Exception:
                logger.debug("skewtrace: checkpoint event not recorded", exc_info=True)

    return wrapper


def patch_checkpoint(ctx: HookContext, patches: Patches) -> None:
    """Wrap ``torch.serialization.save``/``load`` and the ``torch.save``/``load`` aliases."""
    import torch
    import torch.serialization as serialization

    for name, span_name, file_position in (
        ("save", semconv.SPAN_CHECKPOINT_SAVE, 1),  # save(obj, f, ...)
        ("load", semconv.SPAN_CHECKPOINT_LOAD, 0),  # load(f, ...)
    ):
        original = getattr(serialization, name)
        wrapper = _traced(ctx, original, span_name, file_position)
        patches.replace(serialization, name, wrapper, original)
        if getattr(torch, name, None) is original:
            patches.replace(torch, name, wrapper, original)
