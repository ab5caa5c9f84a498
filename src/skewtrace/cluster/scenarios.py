"""Faults to inject into the main job, and what skewtrace should conclude from each.

A fault is written ``KIND:TARGET:AMOUNT[@START[:END]]``; faults combine by giving several.
Steps are the job's (0-based); without ``@`` a fault lasts the whole run, ``@START`` runs
from START to the end, ``@START:END`` over [START, END).

==========  ==================  ================================================================
kind        target              amount
==========  ==================  ================================================================
compute     rank                seconds of extra busy compute in the rank's forward, per step
data        rank                seconds the rank's data loader waits per batch
jitter      ranks ``0,2,4``     up to that many seconds (uniform) of busy compute per step
hetero      node ``node5``      slowdown factor of the node's ranks' compute (2 = half speed),
                                whole run
rack        switch ``leaf1``    seconds of extra compute on every rank behind the switch
nic         node ``node2``      the node's NIC rate in Mbit/s, both directions
uplink      switch ``leaf0``    the switch's uplink rate to the spine in Mbit/s, both ways
==========  ==================  ================================================================

The first four and ``rack`` are applied by the training script itself (its fault flags);
``nic`` and ``uplink`` by the orchestrator, which reshapes the emulated links when the job
reaches START and restores them at END. ``nic`` and ``uplink`` need the emulated fabric.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from skewtrace import semconv

KINDS = ("compute", "data", "jitter", "hetero", "rack", "nic", "uplink")
NETWORK_KINDS = ("nic", "uplink")

PRESETS: dict[str, str] = {
    "compute": "compute:4:0.05@10",
    "data": "data:1:0.05@10",
    "nic": "nic:node2:200@10",
    "uplink": "uplink:leaf0:200@10",
    "rack": "rack:leaf1:0.05@10",
    "jitter": "jitter:0,2,4:0.04",
    # 12, not 2: on this CPU emulation a stage's compute is ~3 ms of a ~130 ms step (the
    # rest is messages and waits on shared cores), so half speed costs the job under 3%,
    # below the diagnosis's min_cost_fraction (5%) and rightly not flagged; at 12 the node
    # costs ~13% of the step, as a half-speed GPU node does where compute is a quarter of it.
    "hetero": "hetero:node5:12",
    "transient": "compute:3:0.05@15:35",
    "nic-transient": "nic:node2:200@15:35",
}
"""Named scenarios for the default 3-switch, 6-node fabric (``--scenario nic`` etc.)."""


class Placement(Protocol):
    """Where the ranks are: what the expectations need of a cluster."""

    def ranks_of_node(self, node: str) -> list[int]: ...

    def nodes_of_switch(self, switch: str) -> list[str]: ...

    def host_of_rank(self, rank: int) -> str: ...

    def switch_of_rank(self, rank: int) -> str: ...

    @property
    def world_size(self) -> int: ...

    @property
    def emulates_network(self) -> bool: ...


@dataclass(frozen=True)
class Expected:
    """What skewtrace should say while faults are active: flagged ranks with their cause,
    suspected parts of the fabric (``nic:<host>/<nic>``, ``uplink:<switch>``,
    ``switch:<name>``, ``host:<name>``), and ranks that may be flagged without it being
    wrong (jitter: a rank whose jitter is large enough for long enough is a straggler)."""

    flagged: dict[int, str] = field(default_factory=dict)
    suspects: frozenset[str] = frozenset()
    allowed: frozenset[int] = frozenset()

    def __or__(self, other: Expected) -> Expected:
        return Expected(
            {**self.flagged, **other.flagged},
            self.suspects | other.suspects,
            self.allowed | other.allowed,
        )

    @property
    def quiet(self) -> bool:
        return not self.flagged and not self.suspects

    def describe(self) -> str:
        if self.quiet:
            return "nothing flagged" + (
                f" (ranks {_ranks(self.allowed)} may be)" if self.allowed else ""
            )
        parts = [f"rank {r} ({cause})" for r, cause in sorted(self.flagged.items())]
        parts += sorted(self.suspects)
        return ", ".join(parts)


def _ranks(ranks: Iterable[int]) -> str:
    return ",".join(str(r) for r in sorted(ranks))


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str
    amount: float
    start: int = 0
    end: int | None = None

    @classmethod
    def parse(cls, text: str) -> Fault:
        """``KIND:TARGET:AMOUNT[@START[:END]]`` or a preset name; ValueError says what is
        wrong."""
        text = text.strip()
        if text in PRESETS:
            return cls.parse(PRESETS[text])
        spec, _, window = text.partition("@")
        parts = spec.split(":")
        if len(parts) != 3:
            raise ValueError(
                f"{text!r}: expected KIND:TARGET:AMOUNT[@START[:END]] or one of "
                f"{', '.join(PRESETS)}"
            )
        kind, target, amount_s = (p.strip() for p in parts)
        if kind not in KINDS:
            raise ValueError(f"{text!r}: KIND must be one of {', '.join(KINDS)}")
        try:
            amount = float(amount_s)
        except ValueError:
            raise ValueError(f"{text!r}: AMOUNT {amount_s!r} is not a number") from None
        if not amount > 0:
            raise ValueError(f"{text!r}: AMOUNT must be > 0")
        if kind == "hetero" and amount <= 1:
            raise ValueError(f"{text!r}: a hetero factor is > 1 (2 = half speed)")
        start, end = 0, None
        if window:
            start_s, _, end_s = window.partition(":")
            try:
                start = int(start_s)
                end = int(end_s) if end_s.strip() else None
            except ValueError:
                raise ValueError(f"{text!r}: @START[:END] must be step numbers") from None
            if start < 0 or (end is not None and end <= start):
                raise ValueError(f"{text!r}: need 0 <= START < END")
        if kind == "hetero" and (start or end is not None):
            raise ValueError(f"{text!r}: hetero lasts the whole run (no @START:END)")
        fault = cls(kind, target, amount, start, end)
        fault._target_shape()
        return fault

    def _target_shape(self) -> None:
        if self.kind in ("compute", "data"):
            if not self.target.isdigit():
                raise ValueError(f"{self}: TARGET is a rank number")
        elif self.kind == "jitter":
            if not all(t.strip().isdigit() for t in self.target.split(",")):
                raise ValueError(f"{self}: TARGET is a list of ranks, e.g. 0,2,4")
        elif self.kind in ("hetero", "nic"):
            if not self.target.startswith("node"):
                raise ValueError(f"{self}: TARGET is a node, e.g. node2")
        elif not self.target.startswith("leaf"):
            raise ValueError(f"{self}: TARGET is a switch, e.g. leaf1")

    def __str__(self) -> str:
        window = ""
        if self.start or self.end is not None:
            window = f"@{self.start}" + ("" if self.end is None else f":{self.end}")
        return f"{self.kind}:{self.target}:{self.amount:g}{window}"

    @property
    def needs_network(self) -> bool:
        return self.kind in NETWORK_KINDS

    def active(self, step: int) -> bool:
        return step >= self.start and (self.end is None or step < self.end)

    def ranks(self, where: Placement) -> list[int]:
        """The ranks the fault acts on (none for ``uplink``)."""
        if self.kind in ("compute", "data"):
            return [int(self.target)]
        if self.kind == "jitter":
            return sorted({int(t) for t in self.target.split(",")})
        if self.kind in ("hetero", "nic"):
            return where.ranks_of_node(self.target)
        if self.kind == "rack":
            return [r for n in where.nodes_of_switch(self.target) for r in where.ranks_of_node(n)]
        return []

    def check(self, where: Placement) -> None:
        """ValueError when the fault cannot run on this cluster."""
        if self.needs_network and not where.emulates_network:
            raise ValueError(f"{self}: needs the emulated network fabric")
        if self.kind == "uplink":
            if not where.nodes_of_switch(self.target):
                raise ValueError(f"{self}: no switch {self.target}")
            return
        ranks = self.ranks(where)
        if not ranks:
            raise ValueError(f"{self}: {self.target} has no ranks on this cluster")
        bad = [r for r in ranks if not 0 <= r < where.world_size]
        if bad:
            raise ValueError(f"{self}: ranks {_ranks(bad)} outside 0..{where.world_size - 1}")

    def describe(self, where: Placement) -> str:
        when = "the whole run"
        if self.start or self.end is not None:
            when = f"steps {self.start}.." + ("end" if self.end is None else f"{self.end - 1}")
        what = {
            "compute": f"rank {self.target}: +{self.amount * 1e3:g} ms of compute per step",
            "data": f"rank {self.target}: data loader +{self.amount * 1e3:g} ms per batch",
            "jitter": f"ranks {self.target}: 0..{self.amount * 1e3:g} ms of random compute",
            "hetero": f"{self.target} (ranks {_ranks(self.ranks(where))}) at "
            f"1/{self.amount:g} speed",
            "rack": f"every node behind {self.target} (ranks {_ranks(self.ranks(where))}): "
            f"+{self.amount * 1e3:g} ms of compute",
            "nic": f"{self.target}'s NIC throttled to {self.amount:g} Mbit/s",
            "uplink": f"{self.target}'s uplink throttled to {self.amount:g} Mbit/s",
        }[self.kind]
        return f"{what}, {when}"

    def train_args(self, where: Placement) -> list[str]:
        """The training script's flags that inject this fault (none for network faults)."""
        window = f"@{self.start}:" + ("" if self.end is None else str(self.end))
        if self.kind in ("compute", "data"):
            return ["--straggler", f"{self.target}:{self.kind}:{self.amount:g}{window}"]
        if self.kind == "rack":
            return [
                a
                for r in self.ranks(where)
                for a in ("--straggler", f"{r}:compute:{self.amount:g}{window}")
            ]
        if self.kind == "jitter":
            return ["--jitter", f"{self.target}:{self.amount:g}{window}"]
        if self.kind == "hetero":
            return [a for r in self.ranks(where) for a in ("--slow-rank", f"{r}:{self.amount:g}")]
        return []

    def expected(self, where: Placement) -> Expected:
        ranks = self.ranks(where)
        if self.kind in ("compute", "data"):
            cause = semconv.CAUSE_COMPUTE if self.kind == "compute" else semconv.CAUSE_DATA
            return Expected({ranks[0]: cause})
        if self.kind == "jitter":
            return Expected(allowed=frozenset(ranks))
        if self.kind in ("hetero", "rack"):
            return Expected(
                {r: semconv.CAUSE_COMPUTE for r in ranks}, frozenset(_derived(ranks, where))
            )
        if self.kind == "nic":
            host = where.host_of_rank(ranks[0])
            return Expected(
                {r: semconv.CAUSE_NETWORK for r in ranks}, frozenset({f"nic:{host}/eth0"})
            )
        return Expected(suspects=frozenset({f"uplink:{self.target}"}))


def _derived(ranks: Sequence[int], where: Placement) -> set[str]:
    """Suspects the collector derives from flagged ranks: a host with two or more of them,
    a switch with flagged ranks on two or more hosts."""
    out: set[str] = set()
    hosts: dict[str, int] = {}
    switches: dict[str, set[str]] = {}
    for r in ranks:
        host = where.host_of_rank(r)
        hosts[host] = hosts.get(host, 0) + 1
        switches.setdefault(where.switch_of_rank(r), set()).add(host)
    out |= {f"host:{h}" for h, n in hosts.items() if n >= 2}
    out |= {f"switch:{s}" for s, hs in switches.items() if len(hs) >= 2 and s != semconv.UNKNOWN}
    return out


def expected_at(faults: Sequence[Fault], step: int, where: Placement) -> Expected:
    """What should be concluded at ``step``: the union over the faults active then."""
    out = Expected()
    for fault in faults:
        if fault.active(step):
            out = out | fault.expected(where)
    return out
