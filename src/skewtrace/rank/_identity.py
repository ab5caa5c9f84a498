"""Who this rank is (job id, rank, world size), decided once, as soon as it is known for sure.

The rank comes from the default process group once there is one (seen when
``init_process_group`` sets it, through a wrapper of torch's ``_update_default_pg``, or found
initialized), else from the launcher's environment (torchrun, Slurm). The job id comes from
the user or the launcher (:func:`skewtrace.rank.config.job_id_from_env`), else a single rank
generates one, else the ranks agree on one through the default group's store
(:mod:`skewtrace.rank._job_id`).

Until then :meth:`IdentityResolver.resolve` answers None and the caller holds its spans (the
export thread leaves them in the bounded event buffer), so none is exported under a wrong
identity:

- several ranks and no id: until the default group exists and rank 0's id is in its store;
- zero-code mode in a process with neither a process group nor a launcher's environment (a
  ``torch.multiprocessing.spawn`` child before its ``init_process_group``, or a plain
  single-process script): for :data:`SINGLE_PROCESS_GRACE_S`, after which (or at exit) the
  process is taken for a single rank.

At exit (``final``) it decides: an identity, or :class:`~skewtrace.rank._job_id.JobIdError`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from skewtrace.rank._job_id import JobIdError, StoreJobId, job_id_key
from skewtrace.rank.config import (
    ConfigError,
    generated_job_id,
    job_id_from_env,
    no_job_id_message,
)
from skewtrace.rank.resource import RankInfo, env_rank_info, group_rank_info

logger = logging.getLogger("skewtrace")

SINGLE_PROCESS_GRACE_S = 10.0
"""Zero-code, no process group and no launcher environment: how long to wait for an
``init_process_group`` before taking the process for a single rank."""


@dataclass(frozen=True)
class Group:
    """The default process group as this rank saw it: its rank, size and store."""

    rank: int
    world_size: int
    store: Any | None


def group_of(pg: Any) -> Group | None:
    """``pg`` (a default process group just set) as a :class:`Group`; None if not a member."""
    import torch.distributed.distributed_c10d as c10d

    if pg is None or pg is c10d.GroupMember.NON_GROUP_MEMBER:
        return None
    entry = c10d._world.pg_map.get(pg)
    return Group(pg.rank(), pg.size(), entry[1] if entry else None)


def current_group() -> Group | None:
    """The initialized default process group, if there is one."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        import torch.distributed.distributed_c10d as c10d

        try:
            store = c10d._get_default_store()
        except Exception:
            store = None
        return Group(dist.get_rank(), dist.get_world_size(), store)
    except Exception:
        logger.debug("skewtrace: default process group not readable", exc_info=True)
        return None


class IdentityResolver:
    """Decides the rank's ``(job id, RankInfo)``; see the module docstring.

    ``wait_for_rank``: zero-code mode, where ``instrument()`` may run before
    ``init_process_group``. Without it (``instrument()`` after ``init_process_group``) the
    rank is what is known at the first call, and several ranks with neither a job id nor a
    process group are a :class:`~skewtrace.rank.config.ConfigError` there.
    """

    def __init__(
        self,
        job_id: str | None,
        *,
        timeout_s: float,
        wait_for_rank: bool,
        final_wait_s: float = 1.0,
        grace_s: float = SINGLE_PROCESS_GRACE_S,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        find_group: Callable[[], Group | None] = current_group,
    ) -> None:
        self._explicit = job_id
        self._timeout_s = timeout_s
        self._wait_for_rank = wait_for_rank
        self._final_wait_s = final_wait_s
        self._grace_s = grace_s
        self._env = env
        self._clock = clock
        self._find_group = find_group
        self._started = clock()
        self._group: Group | None = None
        self._agreement: StoreJobId | None = None
        self.result: tuple[str, RankInfo] | None = None
        self.rank_info: RankInfo | None = None
        """The rank as far as known (also when no job id could be agreed on)."""

    def on_group(self, group: Group) -> None:
        """The default process group was just created (on the thread that created it: no
        store call here)."""
        if self._group is None:
            self._group = group

    def resolve(self, final: bool = False) -> tuple[str, RankInfo] | None:
        """``(job id, rank)`` once known, else None (ask again later). ``final``: the last
        chance, at exit: answers or raises :class:`JobIdError`."""
        if self.result is not None:
            return self.result
        env = os.environ if self._env is None else self._env
        if self._group is None:
            self._group = self._find_group()
        group = self._group
        if group is not None:
            info: RankInfo | None = group_rank_info(group.rank, group.world_size, env)
        else:
            info = env_rank_info(env)
            if info is None:
                waiting = self._clock() - self._started < self._grace_s
                if self._wait_for_rank and waiting and not final:
                    return None
                info = RankInfo(rank=0, local_rank=0, world_size=1)
        assert info is not None
        self.rank_info = info
        job_id = job_id_from_env(self._explicit, env)
        if job_id is None:
            if info.world_size <= 1:
                job_id = generated_job_id()
            elif group is None:
                if not self._wait_for_rank:
                    raise ConfigError(no_job_id_message(info.world_size))
                if final:
                    raise JobIdError(
                        f"no job id: none was given (pass job_id= or set SKEWTRACE_JOB_ID) and "
                        f"this rank ({info.rank} of {info.world_size}) never saw a process "
                        "group to agree on one through"
                    )
                return None
            else:
                job_id = self._agree(group, final)
                if job_id is None:
                    return None
        self.result = (job_id, info)
        return self.result

    def _agree(self, group: Group, final: bool) -> str | None:
        if group.store is None:
            raise JobIdError(
                "no job id: none was given (pass job_id= or set SKEWTRACE_JOB_ID) and the "
                "default process group has no store to agree on one through"
            )
        if self._agreement is None:
            self._agreement = StoreJobId(
                group.store,
                group.rank,
                self._timeout_s,
                key=job_id_key(self._env),
                clock=self._clock,
            )
        if not final:
            return self._agreement.poll()
        job_id = self._agreement.wait(self._final_wait_s)
        if job_id is None:
            raise JobIdError(
                f"no job id: rank 0's generated id was not in the process group's store by "
                f"the time rank {group.rank} exited"
            )
        return job_id
