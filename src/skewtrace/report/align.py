"""Putting every rank's spans of a step on one clock, from the collectives' clock offsets.

Each rank stamps its spans with its host's clock, and hosts' clocks differ by milliseconds
(seconds, without NTP). A waterfall drawn from raw timestamps would show ranks that waited
as late and ranks that were late as early. The Collector measures the difference: a blocking
collective ends at nearly the same true time on every member, so it writes on each member's
span ``training.clock.offset`` = this member's end timestamp minus the median end timestamp
of the collective's members.

Why not simply subtract the median of a rank's offsets: each collective's offsets are
relative to *its own members'* median clock, and that reference differs from group to group
(a tensor-parallel group inside one leaf, a data-parallel group across leaves). The median
of a rank's offsets mixes those references and can be off by as much as the host clocks
differ from each other. The *difference* between two members' offsets in one collective,
on the other hand, is exactly the difference of their clocks, whatever the reference. So:

1. For every collective of the step, each member's offset minus the offset of the
   collective's lowest rank is one measurement of their clock difference.
2. Per pair of ranks, the median of its measurements (robust to one odd collective).
3. From the lowest rank of each connected set of ranks (ranks joined by collectives), walk
   the pairs breadth first: a rank's clock is its neighbour's plus their difference.
4. Anchor each connected set where the simple estimate puts it: shift it so that, over its
   ranks, the median of (walked offset minus the rank's median ``training.clock.offset``)
   is zero. With a world group in the step that makes every offset relative to the median
   rank's clock.

A rank with no annotated collective in the step takes the offset of a rank on the same host
(same clock); with none, it is left unaligned (offset 0), and the report says so.

Point-to-point spans are not used: a send ends without waiting for its receiver, so their
end times are not simultaneous. The aligned time of a span is its timestamp minus its rank's
offset.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from collections.abc import Hashable, Iterable, Mapping

from skewtrace import semconv

__all__ = ["estimate_offsets"]


def estimate_offsets(
    observations: Iterable[tuple[Hashable, int, float]],
    hosts: Mapping[int, str] | None = None,
) -> dict[int, float]:
    """Each rank's clock offset in seconds (subtract it from the rank's timestamps).

    observations: (collective key, rank, ``training.clock.offset``) for the members of the
    step's collectives; the key is anything equal on every member of one collective, e.g.
    (process group, sequence number).
    hosts: rank -> host; ranks without observations take an aligned same-host rank's offset
    (a host named ``unknown`` is not one host).
    Ranks with neither are absent from the result.
    """
    members: dict[Hashable, dict[int, float]] = defaultdict(dict)
    own: dict[int, list[float]] = defaultdict(list)
    for key, rank, offset in observations:
        members[key][rank] = offset
        own[rank].append(offset)

    measurements: dict[tuple[int, int], list[float]] = defaultdict(list)
    for by_rank in members.values():
        if len(by_rank) < 2:
            continue
        pivot = min(by_rank)
        for rank, offset in by_rank.items():
            if rank != pivot:
                # clock(rank) - clock(pivot)
                measurements[(pivot, rank)].append(offset - by_rank[pivot])

    neighbours: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for (a, b), deltas in measurements.items():
        delta = statistics.median(deltas)
        neighbours[a].append((b, delta))
        neighbours[b].append((a, -delta))

    offsets: dict[int, float] = {}
    for root in sorted(own):
        if root in offsets:
            continue
        component = {root: 0.0}
        queue = deque([root])
        while queue:
            at = queue.popleft()
            for nxt, delta in sorted(neighbours[at]):
                if nxt not in component:
                    component[nxt] = component[at] + delta
                    queue.append(nxt)
        shift = statistics.median(
            component[r] - statistics.median(own[r]) for r in sorted(component)
        )
        for r, value in component.items():
            offsets[r] = value - shift

    if hosts:
        by_host: dict[str, float] = {}
        for r in sorted(offsets):
            host = hosts.get(r)
            if host and host != semconv.UNKNOWN:
                by_host.setdefault(host, offsets[r])
        for r, host in hosts.items():
            if r not in offsets and host in by_host:
                offsets[r] = by_host[host]
    return offsets
