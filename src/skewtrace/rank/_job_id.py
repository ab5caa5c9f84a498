"""A job id nobody gave: the ranks agree on one through the default process group's store.

Without an id from the user or the launcher (``SKEWTRACE_JOB_ID``, ``TORCHELASTIC_RUN_ID``
other than torchrun's ``none``, ``SLURM_JOB_ID``; see :func:`skewtrace.rank.config.job_id_from_env`)
and with several ranks, rank 0 generates an id and writes it under :data:`JOB_ID_KEY` in the
store of the default process group (the one ``init_process_group`` made, which every rank
already reached), and the other ranks read it there. This is what makes torchrun's static
rendezvous (``--master-port``, no ``--rdzv-id``) and plain ``torch.multiprocessing.spawn``
jobs work with no configuration.

Rank 0 writes with ``compare_set(key, "", id)``: a value already under the key (another
writer of the same store) wins, so whatever happens the ranks read one value. The others
look with ``check`` (one round trip, never a wait) each time they are asked, and read the
value once it is there; nothing here waits inside a store call on the training thread, and
the blocking form (:meth:`StoreJobId.wait`) is bounded and used only by the export thread's
final flush. A rank that has not seen the value ``timeout_s`` after it first asked gives up
(:class:`JobIdError`). A worker group restarted by torchrun (``--max-restarts``) agrees on
a new id: its static rendezvous keeps one store for every attempt, so the key names the
attempt (:func:`job_id_key`, from ``TORCHELASTIC_RESTART_COUNT``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from skewtrace.rank.config import generated_job_id, restart_attempt

JOB_ID_KEY = "skewtrace/job_id"
"""Our key in the default group's store (torch's own keys have no ``skewtrace/`` prefix)."""


def job_id_key(env: Mapping[str, str] | None = None) -> str:
    """:data:`JOB_ID_KEY`, with ``/attempt<N>`` in a restarted torchrun worker group."""
    attempt = restart_attempt(env)
    return f"{JOB_ID_KEY}/attempt{attempt}" if attempt else JOB_ID_KEY


DROP_REASON_NO_JOB_ID = "no_job_id"
"""``skewtrace.events.dropped{reason=...}`` of events that never got a job id."""


class JobIdError(RuntimeError):
    """The ranks could not agree on a job id; the rank's spans are dropped."""

    drop_reason = DROP_REASON_NO_JOB_ID


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


class StoreJobId:
    """One rank's side of the agreement on ``store`` (a ``torch.distributed.Store``)."""

    def __init__(
        self,
        store: Any,
        rank: int,
        timeout_s: float,
        *,
        key: str = JOB_ID_KEY,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        generate: Callable[[], str] = lambda: generated_job_id("job"),
    ) -> None:
        self._store = store
        self.rank = rank
        self.timeout_s = timeout_s
        self._key = key
        self._clock = clock
        self._sleep = sleep
        self._generate = generate
        self._deadline = clock() + timeout_s
        self.value: str | None = None

    def poll(self) -> str | None:
        """The agreed id, or None while rank 0 has not written it; never waits for it.

        Raises :class:`JobIdError` when the store fails or the deadline has passed.
        """
        if self.value is not None:
            return self.value
        try:
            if self.rank == 0:
                value = _text(self._store.compare_set(self._key, "", self._generate()))
            elif self._store.check([self._key]):
                value = _text(self._store.get(self._key))
            else:
                value = ""
        except Exception as exc:
            raise JobIdError(
                f"no job id: the process group's store failed while rank {self.rank} "
                f"{'wrote' if self.rank == 0 else 'read'} {self._key!r} ({exc!r})"
            ) from exc
        if value.strip():
            self.value = value.strip()
            return self.value
        if self._clock() >= self._deadline:
            raise JobIdError(
                f"no job id: rank 0 did not write one to the process group's store "
                f"({self._key!r}) within {self.timeout_s:g} s; pass job_id= or set "
                "SKEWTRACE_JOB_ID on every rank, or run skewtrace on rank 0 too"
            )
        return None

    def wait(self, timeout_s: float, interval_s: float = 0.05) -> str | None:
        """:meth:`poll` until the id is there, at most ``timeout_s`` (and never past the
        deadline, where :meth:`poll` raises)."""
        end = self._clock() + max(0.0, timeout_s)
        while True:
            value = self.poll()
            if value is not None or self._clock() >= end:
                return value
            self._sleep(interval_s)
