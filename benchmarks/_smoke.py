"""What a benchmark's ``--smoke`` run prints where its full run prints a verdict.

``--smoke`` runs a benchmark end to end at its smallest size (one round, the fewest steps,
ranks and arms that still take every code path): ``tests/test_benchmark_smoke.py`` runs each
so that none breaks unseen. At that size a figure means nothing, so a target that depends on
the machine (a throughput, a latency, a gain, a share of a core) is printed beside
:data:`NOT_JUDGED` instead of met or missed. What does not depend on the size (spans lost
uncounted, a wrong rank flagged, decisions from another policy than the arm's, a dead
Collector) is judged as in a full run: a ``FAIL`` line and exit status 1. So ``FAIL`` in a
benchmark's output is always a real failure.
"""

from __future__ import annotations

NOT_JUDGED = "SMOKE (target not judged)"
"""In place of a target's verdict in a ``--smoke`` run."""
SMOKE_DONE = "SMOKE (ran end to end; targets not judged)"
"""The last line of a ``--smoke`` run that found no real failure, where a full run prints
``PASS``."""
SMOKE_HELP = "the smallest run that takes every code path (tests/test_benchmark_smoke.py)"


def verdict(ok: bool, smoke: bool, met: str = "met", missed: str = "NOT met") -> str:
    """A target's verdict, or :data:`NOT_JUDGED` in a ``--smoke`` run."""
    if smoke:
        return NOT_JUDGED
    return met if ok else missed
