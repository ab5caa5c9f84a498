"""``checkpoint.save`` / ``checkpoint.load`` spans: the fstype mapping and mount lookup on a
fake mount table, then real ``torch.save``/``torch.load`` calls on one gloo rank with spans
read from an in-memory exporter."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.serialization
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from torch import nn

import skewtrace
from skewtrace import semconv
from skewtrace.rank._events import CHECKPOINT, CheckpointEvent, typed
from skewtrace.rank._export.materialize import Identity, SpanMaterializer
from skewtrace.rank.hooks import MARKER
from skewtrace.rank.hooks.checkpoint import (
    PATH_KINDS,
    PathKinds,
    fstype_of,
    parse_mountinfo,
    path_kind_of_fstype,
)
from skewtrace.rank.resource import RankInfo, build_resource

ORIGINALS: dict[str, Callable[..., Any]] = {
    "save": torch.serialization.save,
    "load": torch.serialization.load,
}


pytestmark = pytest.mark.usefixtures("unit_job")


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)


def _checkpoint_spans(spans: tuple[ReadableSpan, ...]) -> list[ReadableSpan]:
    names = (semconv.SPAN_CHECKPOINT_SAVE, semconv.SPAN_CHECKPOINT_LOAD)
    return sorted((s for s in spans if s.name in names), key=lambda s: s.start_time or 0)


def _mount_fstype_from_proc_mounts(path: Path) -> str:
    """The fstype of ``path``'s mount, read from /proc/mounts (not the code under test's
    /proc/self/mountinfo parser)."""
    resolved = os.path.realpath(path)
    best, best_len = "", -1
    with open("/proc/mounts", encoding="utf-8") as file:
        for line in file:
            fields = line.split()
            point = fields[1].replace("\\040", " ")
            inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= best_len:
                best, best_len = fields[2], len(point)
    return best


# ------------------------------------------------------------------ fstype -> kind, mounts


@pytest.mark.parametrize(
    ("fstype", "kind"),
    [
        ("tmpfs", "memory"),
        ("ramfs", "memory"),
        ("nfs", "network"),
        ("nfs4", "network"),
        ("lustre", "network"),
        ("gpfs", "network"),
        ("ceph", "network"),
        ("cifs", "network"),
        ("smb3", "network"),
        ("beegfs", "network"),
        ("9p", "network"),
        ("fuse.gcsfuse", "network"),
        ("fuse.s3fs", "network"),
        ("fuse.juicefs", "network"),
        ("fuse.sshfs", "network"),
        ("fuse.some-local-thing", "unknown"),
        ("fuse", "unknown"),
        ("ext4", "local"),
        ("xfs", "local"),
        ("btrfs", "local"),
        ("zfs", "local"),
        ("overlay", "local"),
        ("f2fs", "local"),
        ("vfat", "local"),
        ("proc", "unknown"),
        ("squashfs", "unknown"),
    ],
)
def test_fstype_maps_to_path_kind(fstype: str, kind: str) -> None:
    assert path_kind_of_fstype(fstype) == kind
    assert kind in PATH_KINDS


FAKE_MOUNTINFO = """\
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 27 0:27 / /dev/shm rw,relatime shared:2 - tmpfs tmpfs rw
40 27 0:40 / /mnt/shared rw,relatime shared:5 master:3 - nfs4 server:/export rw,vers=4.2
41 40 0:41 / /mnt/shared/scratch rw - lustre 10.0.0.1@o2ib:/fs rw
42 27 0:42 / /mnt/bucket\\040one rw,nosuid - fuse.gcsfuse my-bucket rw
43 27 259:1 / /mnt/data rw - xfs /dev/nvme0n1 rw
44 27 0:44 / /mnt/data rw - tmpfs tmpfs rw
not a mountinfo line
"""


def test_mountinfo_is_parsed_with_escapes_and_optional_fields() -> None:
    mounts = parse_mountinfo(FAKE_MOUNTINFO)
    assert mounts == [
        ("/", "ext4"),
        ("/dev/shm", "tmpfs"),
        ("/mnt/shared", "nfs4"),
        ("/mnt/shared/scratch", "lustre"),
        ("/mnt/bucket one", "fuse.gcsfuse"),
        ("/mnt/data", "xfs"),
        ("/mnt/data", "tmpfs"),
    ]


@pytest.mark.parametrize(
    ("path", "fstype"),
    [
        ("/home/user/ckpt.pt", "ext4"),
        ("/dev/shm/ckpt.pt", "tmpfs"),
        ("/mnt/shared/run1/ckpt.pt", "nfs4"),
        ("/mnt/shared/scratch/ckpt.pt", "lustre"),  # the longest mount point wins
        ("/mnt/sharedfoo/ckpt.pt", "ext4"),  # a prefix of the name is not a parent
        ("/mnt/bucket one/ckpt.pt", "fuse.gcsfuse"),
        ("/mnt/data/ckpt.pt", "tmpfs"),  # mounted over the xfs one: the later wins
        ("/mnt/shared", "nfs4"),
    ],
)
def test_longest_mount_point_prefix(path: str, fstype: str) -> None:
    assert fstype_of(path, parse_mountinfo(FAKE_MOUNTINFO)) == fstype


def test_path_kinds_reads_the_table_once_and_caches_per_directory(tmp_path: Path) -> None:
    # Under a directory that does not exist here, so no real symlink changes the paths.
    base = "/nonexistent-skewtrace-root"
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(FAKE_MOUNTINFO.replace(" /mnt/", f" {base}/mnt/"))
    kinds = PathKinds(str(mountinfo))
    assert kinds.kind(f"{base}/mnt/shared/step-1.pt") == "network"
    assert kinds.kind(f"{base}/mnt/shared/scratch/step-1.pt") == "network"
    assert kinds.kind(f"{base}/mnt/data/step-1.pt") == "memory"
    assert kinds.kind(f"{base}/other/x.pt") == "local"
    # Parsed once: a changed table is not re-read.
    mountinfo.write_text("")
    assert kinds.kind(f"{base}/mnt/bucket one/x.pt") == "network"
    assert PathKinds(str(tmp_path / "missing")).kind("/any/file.pt") == "unknown"


def test_checkpoint_event_materializes_under_the_step() -> None:
    identity = Identity("job-x", 0, build_resource("job-x", RankInfo(0, 0, 1), host_name="n1"))
    materializer = SpanMaterializer(identity, epoch_anchor_ns=0)
    raw = (CHECKPOINT, semconv.SPAN_CHECKPOINT_SAVE, 2, 10, 20, 123, "local")
    assert typed(raw) == CheckpointEvent(semconv.SPAN_CHECKPOINT_SAVE, 2, 10, 20, 123, "local")
    spans = materializer.materialize(
        [raw, (CHECKPOINT, semconv.SPAN_CHECKPOINT_LOAD, 2, 30, 40, None, "stream")]
    )
    save, load = spans
    assert dict(save.attributes or {}) == {
        semconv.STEP: 2,
        semconv.CHECKPOINT_PATH_KIND: "local",
        semconv.CHECKPOINT_BYTES: 123,
    }
    assert dict(load.attributes or {}) == {semconv.STEP: 2, semconv.CHECKPOINT_PATH_KIND: "stream"}
    assert save.parent is not None and load.parent is not None
    assert save.parent.span_id == load.parent.span_id


# ------------------------------------------------------------------ instrumented torch.save/load


@pytest.mark.slow
def test_save_and_load_spans_in_the_step(
    world_of_one: None,
    memory_provider: tuple[TracerProvider, InMemorySpanExporter],
    tmp_path: Path,
) -> None:
    provider, exporter = memory_provider
    optimizer = _optimizer()
    skewtrace.instrument(optimizer=optimizer, tracer_provider=provider)
    path = tmp_path / "ckpt.pt"
    state = {"weights": torch.arange(1000, dtype=torch.float32)}
    torch.save(state, path)  # step 0
    optimizer.step()
    loaded = torch.load(str(path))  # step 1
    optimizer.step()
    skewtrace.uninstrument()
    assert torch.equal(loaded["weights"], state["weights"])

    spans = exporter.get_finished_spans()
    save, load = _checkpoint_spans(spans)
    assert (save.name, load.name) == (semconv.SPAN_CHECKPOINT_SAVE, semconv.SPAN_CHECKPOINT_LOAD)
    size = path.stat().st_size
    expected_kind = path_kind_of_fstype(_mount_fstype_from_proc_mounts(tmp_path))
    for span, step in ((save, 0), (load, 1)):
        attributes = span.attributes or {}
        assert attributes[semconv.STEP] == step
        assert attributes[semconv.CHECKPOINT_BYTES] == size
        assert attributes[semconv.CHECKPOINT_PATH_KIND] in PATH_KINDS
        assert attributes[semconv.CHECKPOINT_PATH_KIND] == expected_kind
        train_step = next(
            s
            for s in spans
            if s.name == semconv.SPAN_STEP and (s.attributes or {})[semconv.STEP] == step
        )
        assert span.parent is not None and train_step.context is not None
        assert span.parent.span_id == train_step.context.span_id
        assert span.context is not None and span.context.trace_id == train_step.context.trace_id
        assert train_step.start_time is not None and train_step.end_time is not None
        assert train_step.start_time <= (span.start_time or 0) <= (span.end_time or 0)
        assert (span.end_time or 0) <= train_step.end_time


def test_stream_has_kind_stream_and_no_bytes(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = memory_provider
    skewtrace.instrument(optimizer=_optimizer(), tracer_provider=provider)
    buffer = io.BytesIO()
    torch.save({"x": torch.ones(3)}, buffer)
    buffer.seek(0)
    torch.load(buffer)
    skewtrace.uninstrument()
    spans = _checkpoint_spans(exporter.get_finished_spans())
    assert [s.name for s in spans] == [semconv.SPAN_CHECKPOINT_SAVE, semconv.SPAN_CHECKPOINT_LOAD]
    for span in spans:
        attributes = span.attributes or {}
        assert attributes[semconv.CHECKPOINT_PATH_KIND] == "stream"
        assert semconv.CHECKPOINT_BYTES not in attributes


def test_failed_save_is_recorded_and_its_exception_propagates(
    world_of_one: None,
    memory_provider: tuple[TracerProvider, InMemorySpanExporter],
    tmp_path: Path,
) -> None:
    provider, exporter = memory_provider
    missing = tmp_path / "no-such-dir" / "ckpt.pt"
    with pytest.raises(Exception) as uninstrumented:
        ORIGINALS["save"]({"x": 1}, missing)
    skewtrace.instrument(optimizer=_optimizer(), tracer_provider=provider)
    with pytest.raises(Exception) as instrumented:
        torch.save({"x": 1}, missing)
    with pytest.raises(FileNotFoundError):
        torch.load(missing)
    skewtrace.uninstrument()
    assert type(instrumented.value) is type(uninstrumented.value)
    assert str(instrumented.value) == str(uninstrumented.value)
    save, load = _checkpoint_spans(exporter.get_finished_spans())
    assert (save.name, load.name) == (semconv.SPAN_CHECKPOINT_SAVE, semconv.SPAN_CHECKPOINT_LOAD)
    for span in (save, load):
        attributes = span.attributes or {}
        assert semconv.CHECKPOINT_BYTES not in attributes  # no file was there
        assert attributes[semconv.CHECKPOINT_PATH_KIND] in PATH_KINDS - {"stream"}


def test_symlinked_file_reports_its_target(
    world_of_one: None,
    memory_provider: tuple[TracerProvider, InMemorySpanExporter],
    tmp_path: Path,
) -> None:
    provider, exporter = memory_provider
    target = tmp_path / "step-100.pt"
    torch.save({"x": torch.ones(100)}, target)
    latest = tmp_path / "latest.pt"
    latest.symlink_to(target)
    skewtrace.instrument(optimizer=_optimizer(), tracer_provider=provider)
    torch.load(latest)
    skewtrace.uninstrument()
    (load,) = _checkpoint_spans(exporter.get_finished_spans())
    assert (load.attributes or {})[semconv.CHECKPOINT_BYTES] == target.stat().st_size


def test_serialization_module_path_is_recorded_once(
    world_of_one: None, memory_provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = memory_provider
    skewtrace.instrument(optimizer=_optimizer(), tracer_provider=provider)
    assert torch.save is torch.serialization.save
    assert torch.load is torch.serialization.load
    torch.serialization.save({"x": 1}, io.BytesIO())
    skewtrace.uninstrument()
    spans = _checkpoint_spans(exporter.get_finished_spans())
    assert [s.name for s in spans] == [semconv.SPAN_CHECKPOINT_SAVE]


@pytest.mark.parametrize("zero_code", [False, True])
def test_uninstrument_restores_the_original_functions(
    world_of_one: None,
    memory_provider: tuple[TracerProvider, InMemorySpanExporter],
    zero_code: bool,
) -> None:
    provider, exporter = memory_provider
    kwargs: dict[str, Any] = {"tracer_provider": provider, "zero_code": zero_code}
    if not zero_code:
        kwargs["optimizer"] = _optimizer()
    skewtrace.instrument(**kwargs)
    for name, original in ORIGINALS.items():
        for owner in (torch, torch.serialization):
            wrapped = getattr(owner, name)
            assert wrapped is not original and getattr(wrapped, MARKER) is original
    skewtrace.uninstrument()
    for name, original in ORIGINALS.items():
        assert getattr(torch, name) is original
        assert getattr(torch.serialization, name) is original
    torch.save({"x": 1}, io.BytesIO())  # not recorded any more
    assert _checkpoint_spans(exporter.get_finished_spans()) == []
