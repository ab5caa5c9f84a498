"""The OpenTelemetry Resource of one rank: who it is, where it runs, on which switch and NIC.

Rank and world size come from the initialized process group, else from torchrun's or Slurm's
environment. Switch and NIC come from :mod:`skewtrace.rank.topology`; GPU identity from
:func:`skewtrace.rank.topology.gpu_attributes`. ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` are honored; the training keys set here win over the latter,
because the collector joins on them.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry.sdk.resources import Resource

from skewtrace import semconv
from skewtrace.rank.topology import discover_topology, gpu_attributes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int


def _env_int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        raw = env.get(name, "").strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r}: expected an integer") from None
    return None


def discover_rank_info(env: Mapping[str, str] | None = None) -> RankInfo:
    """Rank and world size from the process group if initialized, else torchrun/Slurm env."""
    env = os.environ if env is None else env
    rank = world_size = None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    if rank is None:
        rank = _env_int(env, "RANK", "SLURM_PROCID")
    if world_size is None:
        world_size = _env_int(env, "WORLD_SIZE", "SLURM_NTASKS")
    return _rank_info(rank, world_size, env)


def env_rank_info(env: Mapping[str, str] | None = None) -> RankInfo | None:
    """Rank and world size from the launcher's environment (torchrun's ``RANK`` and
    ``WORLD_SIZE``, Slurm's ``SLURM_PROCID`` and ``SLURM_NTASKS``); None when it names
    neither (a single process, or a ``torch.multiprocessing.spawn`` child before its
    ``init_process_group``)."""
    env = os.environ if env is None else env
    rank = _env_int(env, "RANK", "SLURM_PROCID")
    world_size = _env_int(env, "WORLD_SIZE", "SLURM_NTASKS")
    if rank is None and world_size is None:
        return None
    return _rank_info(rank, world_size, env)


def group_rank_info(rank: int, world_size: int, env: Mapping[str, str] | None = None) -> RankInfo:
    """A process group's rank and size, with the local rank from the environment."""
    return _rank_info(rank, world_size, os.environ if env is None else env)


def _rank_info(rank: int | None, world_size: int | None, env: Mapping[str, str]) -> RankInfo:
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    # Without either variable the ranks are assumed to share one node.
    local_rank = _env_int(env, "LOCAL_RANK", "SLURM_LOCALID")
    return RankInfo(
        rank=rank, local_rank=rank if local_rank is None else local_rank, world_size=world_size
    )


def _topology(host_name: str, env: Mapping[str, str]) -> tuple[str, str]:
    info = discover_topology(host_name, env)
    return info.switch, info.nic


def _gpu(device_index: int | None) -> dict[str, str | int]:
    if device_index is None:
        return {}
    try:
        return dict(gpu_attributes(device_index))
    except Exception:  # a GPU query failing must not stop training
        logger.warning("skewtrace: could not read GPU attributes", exc_info=True)
        return {}


def rank_attributes(
    job_id: str,
    rank_info: RankInfo,
    *,
    device_index: int | None = None,
    host_name: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, str | int]:
    """The training keys of the rank's resource (without service.name)."""
    env = os.environ if env is None else env
    host = host_name or socket.gethostname()
    switch, nic = _topology(host, env)
    attributes: dict[str, str | int] = {
        semconv.SERVICE_INSTANCE_ID: f"{job_id}/{rank_info.rank}",
        semconv.JOB_ID: job_id,
        semconv.RANK: rank_info.rank,
        semconv.LOCAL_RANK: rank_info.local_rank,
        semconv.WORLD_SIZE: rank_info.world_size,
        semconv.HOST_NAME: host,
        semconv.SWITCH: switch,
        semconv.NIC: nic,
    }
    attributes.update(_gpu(device_index))
    return attributes


def build_resource(
    job_id: str,
    rank_info: RankInfo,
    *,
    device_index: int | None = None,
    host_name: str | None = None,
    env: Mapping[str, str] | None = None,
    base: Resource | None = None,
) -> Resource:
    """The rank's resource; ``base`` is a user TracerProvider's resource to extend.

    ``Resource.create`` reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME. A service.name
    the user chose (in ``base`` or the environment) is kept; otherwise it is
    ``skewtrace-training`` instead of the SDK's ``unknown_service``.
    """
    attributes = rank_attributes(
        job_id, rank_info, device_index=device_index, host_name=host_name, env=env
    )
    resource = Resource.create(attributes) if base is None else base.merge(Resource(attributes))
    service = str(resource.attributes.get(semconv.SERVICE_NAME, ""))
    if not service or service.startswith("unknown_service"):
        resource = resource.merge(Resource({semconv.SERVICE_NAME: semconv.DEFAULT_SERVICE_NAME}))
    return resource
