"""The rank side of pacing: a background poller of the pacer and the delay it applies per step.

::

    client = PacingClient("http://127.0.0.1:4320", job_id, rank, max_delay_s=0.05)
    client.start()                      # daemon thread: GET {url}/v1/pacing?job=<job_id>
    ...
    seconds, version = client.current_delay()   # once per step, on the training thread
    apply_delay(seconds, device)                 # before the step's forward
    ...
    client.stop()

The same answer carries the interleave policy's ``offsets`` or ``schedule``:
:meth:`PacingClient.current_hold` gives the rank's hold before forward for its process groups
(:meth:`~skewtrace.decision.DecisionBody.hold_for`), on the pacer's clock: each poll
estimates this host's clock offset to it from the answer's ``served_unix`` and the round trip
(the estimate from the shortest of the last 8 round trips is kept; its error is at most half
that round trip).

The same answer carries the rebalancing policy's ``shares`` (``--policy rebalance``):
:meth:`PacingClient.current_shares` returns them for
:class:`skewtrace.rank.rebalance_sampler.ShareSampler`, which applies them on every rank at the
same step (``docs/rebalancing.md``), and the work-balance policy's ``balance`` (``--policy
balance``): :meth:`PacingClient.current_balance`, for
:class:`skewtrace.rank.work_balance.WorkBalancedSampler`.

The answer is a :class:`~skewtrace.decision.DecisionBody` (read with its tolerant
``from_json``: unknown fields ignored, missing informational ones defaulted); importing it
brings in nothing of the controller's servers, grpc or the OTel SDK.

Fail open. ``current_delay`` only reads an immutable tuple the poller replaced; it never does
I/O, never blocks on a lock and never raises. Whenever the pacer is unreachable, answers an
error, sends something that is not a valid decision (a
:class:`~skewtrace.decision.DecisionError`), or has not been heard from for
``stale_after_s`` (three poll intervals by default), the delay is 0. An outage is logged once
when it starts and once when it ends; the poller retries with exponential backoff, capped at
``max_backoff_s``. The rank's own ``max_delay_s`` (``SKEWTRACE_PACER_RANK_MAX_DELAY_MILLIS``)
caps every delay, whatever the pacer says. Shares fail open the same way, to ``None`` (equal
shares); a malformed ``shares`` field costs only the shares, never the delay.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Protocol
from urllib.parse import quote

from skewtrace.decision import (
    STEP_AGE_PARAM,
    DecisionBody,
    normalise_shares,
    read_shares,
    read_shares_version,
)

_log = logging.getLogger(__name__)

_MAX_RESPONSE_BYTES = 1 << 20
# torch.cuda._sleep spins one kernel; past this many cycles (~10 ms at 2 GHz) it is split so no
# single kernel hogs an SM scheduler slot for long.
_MAX_CYCLES_PER_KERNEL = 20_000_000


class RankPacer(Protocol):
    """What the rank reads from its pacer, once per step on the training thread (the hooks,
    :class:`~skewtrace.rank.hooks._context.HookContext`) and at the sampler's sync points
    (:class:`~skewtrace.rank.rebalance_sampler.ShareSampler`). None of these may raise or
    block. :class:`PacingClient` is one; a user's ``pacing_client`` becomes one with
    :func:`as_rank_pacer`."""

    def current_delay(self) -> tuple[float, int]:
        """(seconds to delay this step, decision version)."""

    def current_hold(self, groups: Iterable[str]) -> float:
        """Seconds to hold before this step's forward for the rank's process ``groups``."""

    def current_shares(self) -> tuple[Mapping[int, float] | None, int]:
        """({rank: share of the global batch} or None for equal shares, shares version)."""

    def current_balance(self) -> tuple[str | None, int]:
        """(``work``, ``count`` or None, balance version): the work-balance policy's split."""

    def note_step_start(self, monotonic_s: float) -> None:
        """The latest step started at ``monotonic_s`` (``time.monotonic()``)."""


class _UserPacer:
    """A user's ``pacing_client`` as a :class:`RankPacer`: ``current_delay`` is required;
    ``current_hold``, ``current_shares``, ``current_balance`` and a ``step_started_at``
    attribute are used where it has them (no hold, equal shares, no split, no step start
    where not)."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self._hold = getattr(source, "current_hold", None)
        self._shares = getattr(source, "current_shares", None)
        self._balance = getattr(source, "current_balance", None)
        self._takes_step_start = hasattr(source, "step_started_at")

    def current_delay(self) -> tuple[float, int]:
        delay, version = self.source.current_delay()
        return delay, version

    def current_hold(self, groups: Iterable[str]) -> float:
        return 0.0 if self._hold is None else float(self._hold(groups))

    def current_shares(self) -> tuple[Mapping[int, float] | None, int]:
        if self._shares is None:
            return None, 0
        shares, version = self._shares()
        return shares, version

    def current_balance(self) -> tuple[str | None, int]:
        if self._balance is None:
            return None, 0
        mode, version = self._balance()
        return mode, version

    def note_step_start(self, monotonic_s: float) -> None:
        if self._takes_step_start:
            self.source.step_started_at = monotonic_s


def as_rank_pacer(source: Any) -> RankPacer:
    """``instrument(pacing_client=...)``: anything with ``current_delay() -> (seconds,
    version)``, as a :class:`RankPacer` (a :class:`PacingClient` as it is)."""
    return source if isinstance(source, PacingClient) else _UserPacer(source)


class PacingClient:
    """Polls the pacer for this rank's delay; see the module docstring."""

    def __init__(
        self,
        url: str,
        job_id: str,
        rank: int,
        *,
        max_delay_s: float,
        poll_interval_s: float = 1.0,
        token: str | None = None,
        stale_after_s: float | None = None,
        max_backoff_s: float = 30.0,
        request_timeout_s: float | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"pacer url {url!r}: expected http(s)://host:port")
        if not (math.isfinite(max_delay_s) and max_delay_s >= 0):
            raise ValueError(f"max_delay_s must be >= 0, got {max_delay_s!r}")
        if not (math.isfinite(poll_interval_s) and poll_interval_s > 0):
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s!r}")
        if not job_id:
            raise ValueError("job_id must not be empty")
        self.url = url.rstrip("/")
        self.job_id = job_id
        self.rank = rank
        self.max_delay_s = max_delay_s
        self.poll_interval_s = poll_interval_s
        self.stale_after_s = 3 * poll_interval_s if stale_after_s is None else stale_after_s
        self.max_backoff_s = max(max_backoff_s, poll_interval_s)
        self.retry_waits: collections.deque[float] = collections.deque(maxlen=16)
        """The waits before the last retries after failed polls, in seconds (the backoff)."""
        # Shorter than the poll interval so one hung request does not hold back the next
        # decision for long; the poll thread is the only one that waits on it.
        self.request_timeout_s = (
            min(2.0, max(0.2, poll_interval_s)) if request_timeout_s is None else request_timeout_s
        )
        self._request_url = f"{self.url}/v1/pacing?job={quote(job_id, safe='')}"
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        # (delay, version, monotonic time of the answer): replaced whole, read without a lock.
        self._latest: tuple[float, int, float] = (0.0, 0, -math.inf)
        # (shares or None, shares version, monotonic time of the answer): likewise.
        self._latest_shares: tuple[dict[int, float] | None, int, float] = (None, 0, -math.inf)
        # (decision body, monotonic time of the answer), for the hold; replaced whole.
        self._latest_body: tuple[DecisionBody | None, float] = (None, -math.inf)
        # (round trip, offset of the pacer's wall clock to ours) of the last polls that said.
        self._clock_samples: collections.deque[tuple[float, float]] = collections.deque(maxlen=8)
        self.clock_offset_s = 0.0
        """The pacer's wall clock minus this host's, estimated from the polls."""
        self.step_started_at: float | None = None
        """When this rank's latest step started (``time.monotonic()``), set by the hooks:
        each poll says how long ago (``step_age``), so that the pacer can place the phases
        of different jobs on its one clock."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self.polls_ok = 0
        self.polls_failed = 0

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name=f"skewtrace-pacing-{self.rank}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.request_timeout_s + 1.0)
        self._latest = (0.0, self._latest[1], -math.inf)
        self._latest_shares = (None, self._latest_shares[1], -math.inf)
        self._latest_body = (None, -math.inf)

    def current_delay(self) -> tuple[float, int]:
        """(seconds in [0, max_delay_s], decision version); 0 when stale or failing."""
        try:
            delay, version, at = self._latest
            if time.monotonic() - at > self.stale_after_s:
                return 0.0, version
            return min(delay, self.max_delay_s), version
        except Exception:  # never raise into training
            return 0.0, 0

    def current_shares(self) -> tuple[dict[int, float] | None, int]:
        """({rank: share of the global batch} or None, shares version); None (equal shares)
        when the pacer publishes none, or its answer is stale or failing."""
        try:
            shares, version, at = self._latest_shares
            if shares is None or time.monotonic() - at > self.stale_after_s:
                return None, version
            return dict(shares), version
        except Exception:  # never raise into training
            return None, 0

    def current_balance(self) -> tuple[str | None, int]:
        """(``work``, ``count`` or None, balance version): how the work-balance policy asks
        each global batch to be split (:class:`skewtrace.rank.work_balance.WorkBalancedSampler`
        with ``mode="pacer"``); None when the pacer decides no split, or its answer is stale
        or failing (the sampler then splits by count)."""
        try:
            body, at = self._latest_body
            if body is None or time.monotonic() - at > self.stale_after_s:
                return None, 0
            return body.balance, body.balance_version or 0
        except Exception:  # never raise into training
            return None, 0

    def current_hold(self, groups: Iterable[str]) -> float:
        """Seconds to hold before this step's forward for the interleave policy (the rank's
        process ``groups`` by name), in [0, max_delay_s]; 0 when stale or failing."""
        try:
            body, at = self._latest_body
            if body is None or time.monotonic() - at > self.stale_after_s:
                return 0.0
            return body.hold_for(groups, time.time() + self.clock_offset_s, self.max_delay_s)
        except Exception:  # never raise into training
            return 0.0

    def note_step_start(self, monotonic_s: float) -> None:
        """Called by the hooks at each step: see :attr:`step_started_at`."""
        self.step_started_at = monotonic_s

    def _note_clock(self, served_unix: float | None, sent: float, received: float) -> None:
        if served_unix is None or received < sent:
            return
        self._clock_samples.append((received - sent, served_unix - (sent + received) / 2))
        self.clock_offset_s = min(self._clock_samples)[1]

    # ------------------------------------------------------------------ poll thread

    def _run(self) -> None:
        backoff = self.poll_interval_s
        while not self._stop.is_set():
            try:
                sent = time.time()
                answer = self._poll_once()
                received = time.time()
                decision = DecisionBody.from_json(answer)
                delay = decision.delay_for(self.rank, self.max_delay_s)
                shares = decision.normalised_shares(), decision.shares_version or 0
            except Exception as exc:
                self._on_failure(exc)
                wait = backoff
                backoff = min(backoff * 2, self.max_backoff_s)
                self.retry_waits.append(wait)
            else:
                answered = time.monotonic()
                self._note_clock(decision.served_unix, sent, received)
                self._latest = (delay, decision.version, answered)
                self._latest_body = (decision, answered)
                self._latest_shares = (*shares, answered)
                self.polls_ok += 1
                if self._failing:
                    self._failing = False
                    _log.info("pacer %s reachable again; pacing resumes", self.url)
                backoff = self.poll_interval_s
                wait = self.poll_interval_s
            self._stop.wait(wait)

    def _on_failure(self, exc: BaseException) -> None:
        # Fail open at once rather than waiting for the last answer to go stale; counted
        # after, so that a reader who sees the count sees the delay gone.
        self._latest = (0.0, self._latest[1], self._latest[2])
        self._latest_shares = (None, self._latest_shares[1], self._latest_shares[2])
        self._latest_body = (None, self._latest_body[1])
        self.polls_failed += 1
        if not self._failing:
            self._failing = True
            _log.warning(
                "pacer %s unusable (%s); no pacing delay until it answers again "
                "(retrying with backoff up to %g s)",
                self.url,
                exc,
                self.max_backoff_s,
            )

    def _poll_once(self) -> Any:
        url = self._request_url
        started = self.step_started_at
        if started is not None:
            url += f"&{STEP_AGE_PARAM}={max(0.0, time.monotonic() - started):.6f}"
        request = urllib.request.Request(url, headers=self._headers)
        with urllib.request.urlopen(request, timeout=self.request_timeout_s) as response:
            body = response.read(_MAX_RESPONSE_BYTES + 1)
        if len(body) > _MAX_RESPONSE_BYTES:
            raise ValueError("pacer answer too large")
        return json.loads(body)


def parse_decision(body: Any, rank: int, max_delay_s: float) -> tuple[float, int]:
    """This rank's (delay, version) from a decision body; raises ValueError
    (:class:`~skewtrace.decision.DecisionError`) when malformed."""
    decision = DecisionBody.from_json(body)
    return decision.delay_for(rank, max_delay_s), decision.version


def parse_shares(body: Any) -> tuple[dict[int, float] | None, int]:
    """(shares, shares version) from a decision body; None when it has no usable shares.

    Usable: an object of non-negative rank numbers to finite non-negative numbers with a
    positive sum (normalised here to 1). Whether they cover the ranks of this job is the
    sampler's check (:mod:`skewtrace.rank.rebalance_sampler`), which knows the world size.
    Reads only ``shares`` and ``shares_version``, whatever else the body holds.
    """
    if not isinstance(body, dict):
        return None, 0
    version = read_shares_version(body.get("shares_version", 0))
    return normalise_shares(read_shares(body.get("shares"))), version


# ---------------------------------------------------------------------- applying a delay


def apply_delay(seconds: float, device: object | None = None) -> None:
    """Delay this rank by ``seconds`` before its next collective.

    On CPU (or no device) the host thread sleeps. On a CUDA device the delay is a spin kernel
    queued on the current stream, so the host keeps launching work and the collective that
    follows on that stream starts ``seconds`` later; the host thread is not blocked.
    """
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        return
    if getattr(device, "type", None) == "cuda":
        _cuda_delay(seconds, device)
        return
    time.sleep(seconds)


def cuda_sleep_cycles(seconds: float, clock_rate_khz: int) -> list[int]:
    """The ``torch.cuda._sleep`` cycle counts for ``seconds`` at ``clock_rate_khz``.

    ``_sleep`` spins on the SM clock, so cycles = seconds * clock rate. Long delays are split
    into kernels of at most ``_MAX_CYCLES_PER_KERNEL`` cycles.
    """
    if not (math.isfinite(seconds) and seconds > 0) or clock_rate_khz <= 0:
        return []
    total = round(seconds * clock_rate_khz * 1000)
    if total <= 0:
        return []
    full, rest = divmod(total, _MAX_CYCLES_PER_KERNEL)
    return [_MAX_CYCLES_PER_KERNEL] * full + ([rest] if rest else [])


@lru_cache(maxsize=16)
def _clock_rate_khz(device_index: int) -> int:
    import torch

    # The SM's maximum (boost) clock: at a lower actual clock the delay runs longer than
    # asked, which the rank's cap bounds only approximately (see docs/pacing.md).
    return int(torch.cuda.get_device_properties(device_index).clock_rate)


def _cuda_delay(seconds: float, device: Any) -> None:
    try:
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
        for cycles in cuda_sleep_cycles(seconds, _clock_rate_khz(index)):
            torch.cuda._sleep(cycles)
    except Exception:
        # Pacing is an optimisation; a CUDA problem here must surface in the training step
        # itself, not in the pacer's delay.
        _log.debug("CUDA pacing delay failed", exc_info=True)
