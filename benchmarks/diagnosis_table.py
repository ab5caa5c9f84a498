"""Print docs/evaluation.md's table: every scenario of tests/scenario_gen.py through the real
otelcol-skewtrace, with the verdict it reached and how many steps it took.

    python benchmarks/diagnosis_table.py [--seeds 3] [--otelcol build/otelcol-skewtrace]
    python benchmarks/diagnosis_table.py --smoke    # three scenarios, one seed

Per scenario: the layout, the injected faults, the expected verdict, the verdict at the last
step, the steps from the onset to the first step with the expected verdict (flag_k = 4
root-cause steps are needed, so 3 is the least), the steps from the end of a fault to the
first step with nothing flagged, and, with --seeds N, in how many of N runs (different
noise, clock offsets and batching) every step's verdict was right.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from _smoke import SMOKE_HELP  # noqa: E402
from collector_harness import (  # noqa: E402
    FILE_EXPORT_YAML,
    OTELCOL_YAML,
    CollectorProcess,
)
from scenario_gen import SCENARIOS, Scenario  # noqa: E402
from scenario_run import Outcome, run_scenarios  # noqa: E402

SETTLE_STEPS = 6
SMOKE_SCENARIOS = ("healthy-2d", "compute-ends-2d", "jitter-3-ranks-2d")
"""``--smoke``: one of each kind of row (nothing injected, a fault that starts and ends, ranks
that may be flagged), on one layout."""


def right(outcome: Outcome) -> bool:
    """Every step's verdict right: no wrong rank ever, the expected verdict after settling."""
    sc, exp = outcome.scenario, outcome.scenario.expected
    allowed = set(exp.flagged) | (exp.allowed or set())
    for v in outcome.steps.values():
        if set(v.flagged) - allowed or (not sc.faults and v.suspects):
            return False
    onset = sc.onset()
    if onset is None or exp.allowed is not None:
        return True
    end = sc.fault_end() or sc.steps
    return all(
        outcome.steps[s].flagged == exp.flagged and outcome.steps[s].suspects == exp.suspects
        for s in range(onset + SETTLE_STEPS, end)
    )


def describe_faults(sc: Scenario) -> str:
    if not sc.faults:
        return "none (jitter, 3% of rank-steps held up to 15 ms)"
    parts = []
    for f in sc.faults:
        target = ",".join(str(t) for t in f.target)
        amount = f"{f.amount:g}x" if f.kind in ("nic", "uplink") else f"+{f.amount * 1e3:g} ms"
        window = f"steps {f.start}-{f.end - 1}" if f.end else f"from step {f.start}"
        parts.append(f"{f.kind} {target} {amount}, {window}")
    return "; ".join(parts)


def describe_verdict(flagged: dict[int, str], suspects: set[str]) -> str:
    if not flagged and not suspects:
        return "nothing flagged"
    by_cause: dict[str, list[int]] = {}
    for rank, cause in sorted(flagged.items()):
        by_cause.setdefault(cause, []).append(rank)
    parts = [f"ranks {','.join(map(str, r))} {c}" for c, r in by_cause.items()]
    parts += sorted(suspects)
    return "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="runs per scenario")
    parser.add_argument("--otelcol", type=Path, default=REPO / "build" / "otelcol-skewtrace")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"{SMOKE_HELP}: one seed of {', '.join(SMOKE_SCENARIOS)}",
    )
    args = parser.parse_args()
    scenarios = SCENARIOS
    if args.smoke:
        args.seeds, scenarios = 1, {name: SCENARIOS[name] for name in SMOKE_SCENARIOS}
    runs: list[Scenario] = []
    for name, sc in scenarios.items():
        for k in range(args.seeds):
            run = copy.copy(sc)
            run.seed = sc.seed + 1000 * k
            run.job = f"{sc.job}-{k}"
            run.name = f"{name}#{k}"
            runs.append(run)
    with (
        tempfile.TemporaryDirectory() as tmp,
        CollectorProcess(args.otelcol, [OTELCOL_YAML, FILE_EXPORT_YAML], Path(tmp)) as col,
    ):
        outcomes = run_scenarios(col, runs, timeout_s=600)
    print(
        "| scenario | layout | injected | expected | verdict (last step) | onset to flag "
        "| end to clear | right in every step |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, sc in scenarios.items():
        first = outcomes[f"{name}#0"]
        flag = first.first_flag_step()
        onset = sc.onset()
        to_flag = "-" if onset is None or flag is None else f"{flag - onset} steps"
        clear = first.clear_step()
        end = sc.fault_end()
        to_clear = "-" if end is None or clear is None else f"{clear - end} steps"
        ok = sum(right(outcomes[f"{name}#{k}"]) for k in range(args.seeds))
        last = first.last()
        exp = sc.expected
        expected = (
            f"only ranks {sorted(exp.allowed)} may be flagged"
            if exp.allowed is not None
            else describe_verdict(exp.flagged, exp.suspects)
        )
        print(
            f"| {name} | {sc.layout.name} | {describe_faults(sc)} | {expected} "
            f"| {describe_verdict(last.flagged, last.suspects)} | {to_flag} | {to_clear} "
            f"| {ok}/{args.seeds} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
