"""``skewtrace advise SPANS.jsonl [--job JOB] [--json]``: the stage partition the Collector
advises for a heavy pipeline stage.

Reads the Collector's file export (``collector-config/file-export.yaml``): the step summaries'
``stage_imbalance`` verdicts with their advised partition (``training.imbalance.partition*``,
written once every stage sent a ``pipeline.layers`` profile), and the ranks' ``pipeline.layers``
spans for the layers' names. Prints the split now and advised, the split points in the form
``examples/frameworks/pipelining.py --split-points`` (and ``torch.distributed.pipelining``'s
``split_spec``) take, each stage's layer time before and after and the replayed saving.

The verdict used is the latest flagged ``stage_imbalance`` (after the hysteresis), else the
latest step that named one as its root cause. Exit status 0 with advice printed; 1 when the
file has no stage imbalance, or one without a partition (no layer profiles: the ranks run
with ``SKEWTRACE_LAYER_PROFILE_EVERY=0``, or fewer steps than it, or a stage never sent one),
or cannot be read; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "advise",
        help="print the stage partition the Collector advises for a heavy pipeline stage",
        description="From the Collector's span file: the layers per stage that minimize the "
        "slowest stage (from the ranks' per-layer times), its split points and the saving "
        "the step replay predicts.",
    )
    parser.add_argument("spans", metavar="SPANS.jsonl", help="the file exporter's output")
    parser.add_argument(
        "--job", default=None, help="the job to advise on (default: the file's only job)"
    )
    parser.add_argument("--json", action="store_true", help="print the advice as one JSON object")
    parser.set_defaults(run=run_advise)


class AdviseError(Exception):
    """No advice: the message says why."""


def advice(path: str, job: str | None = None) -> dict[str, Any]:
    """The advice for the file's job (see the module); raises AdviseError without one."""
    from skewtrace import semconv
    from skewtrace.report.collect import parse_summary
    from skewtrace.report.spans import read_file_export

    try:
        spans = read_file_export(path)
    except OSError as exc:
        raise AdviseError(str(exc)) from None
    jobs = sorted(
        {str(s.resource.get(semconv.JOB_ID)) for s in spans if semconv.JOB_ID in s.resource}
    )
    if job is None:
        if len(jobs) != 1:
            raise AdviseError(
                f"{path} holds {len(jobs)} jobs ({', '.join(jobs) or 'none'}): name one with --job"
            )
        job = jobs[0]
    elif job not in jobs:
        raise AdviseError(f"no job {job!r} in {path} (jobs: {', '.join(jobs) or 'none'})")
    mine = [s for s in spans if s.resource.get(semconv.JOB_ID) == job]
    summaries = sorted(
        (
            summary
            for s in mine
            if s.name == semconv.SPAN_STEP_SUMMARY and (summary := parse_summary(s)) is not None
        ),
        key=lambda summary: summary.step,
    )
    chosen, how = None, ""
    for summary in reversed(summaries):
        stages = [i for i in summary.imbalances if i.cause == semconv.CAUSE_STAGE_IMBALANCE]
        if stages:
            chosen, how = (summary, stages), "flagged"
            break
    if chosen is None:
        for summary in reversed(summaries):
            stages = [
                i for i in summary.imbalance_causes if i.cause == semconv.CAUSE_STAGE_IMBALANCE
            ]
            if stages:
                chosen, how = (summary, stages), "named as the step's root cause, not flagged"
                break
    if chosen is None:
        raise AdviseError(
            f"job {job}: no stage_imbalance in its {len(summaries)} step summaries: "
            "no pipeline stage does materially more work than the others (nothing to move)"
        )
    summary, stages = chosen
    imbalance = max(stages, key=lambda i: i.cost_s)
    partition = next((i.partition for i in stages if i.partition is not None), None)
    if partition is None:
        raise AdviseError(
            f"job {job}: stage {imbalance.stage} is a stage_imbalance (step {summary.step}) but "
            "no partition was advised: no layer profile from every stage (pipeline.layers: "
            "set SKEWTRACE_LAYER_PROFILE_EVERY to a number of steps the run exceeds; 0 turns "
            "it off), or the current split is already the best"
        )
    names = _layer_names(mine, len(partition.current))
    owner = [st for st, n in enumerate(partition.current) for _ in range(n)]
    at, firsts, owners = 0, [], []
    for n in partition.layers:
        firsts.append(names[at] if names and at < len(names) else str(at))
        owners.append(owner[at] if at < len(owner) else -1)
        at += n
    return {
        "job": job,
        "step": summary.step,
        "verdict": how,
        "stage": imbalance.stage,
        "fix": imbalance.fix,
        "layers_now": list(partition.current),
        "layers_advised": list(partition.layers),
        "split_points_now": list(partition.current_points),
        "split_points": list(partition.split_points),
        "first_layer_advised": firsts,
        "first_layer_stage_now": owners,
        "stage_seconds_now": list(partition.before_s),
        "stage_seconds_advised": list(partition.after_s),
        "saving_s": partition.saving_s,
        "step_s": summary.duration_s,
        "min_saving_s": summary.min_saving_s,
        # The verdict recommends the partition only where the replay says it saves at least
        # the step's naming bar (training.step.min_saving; a summary without it: yes).
        "recommended": partition.saving_s >= summary.min_saving_s,
        "layer_names": names,
    }


def _layer_names(spans: list[Any], stages: int) -> list[str]:
    """Every stage's layer names, stages in order (empty when the stages cannot be told):
    each rank's latest pipeline.layers span, its stage from its point-to-point messages of
    one step (a rank whose first message is a send is stage 0, one whose first is a receive
    one more than its sender)."""
    from skewtrace import semconv

    latest: dict[int, Any] = {}
    for s in spans:
        if s.name != semconv.SPAN_PIPELINE_LAYERS or semconv.RANK not in s.resource:
            continue
        rank = int(s.resource[semconv.RANK])
        if rank not in latest or int(s.attributes.get(semconv.STEP, -1)) > int(
            latest[rank].attributes.get(semconv.STEP, -1)
        ):
            latest[rank] = s
    messages = [
        s
        for s in spans
        if s.attributes.get(semconv.COLLECTIVE_PEER) is not None and semconv.RANK in s.resource
    ]
    # The latest step every messaging rank sent or received in (a first step can hold a
    # schedule's own set-up messages, shape inference, in another order).
    steps: dict[int, set[int]] = defaultdict(set)
    for s in messages:
        steps[int(s.resource[semconv.RANK])].add(int(s.attributes.get(semconv.STEP, -1)))
    common = set.intersection(*steps.values()) if steps else set()
    if not common:
        return []
    step = max(common)
    first: dict[int, Any] = {}
    for s in messages:
        rank = int(s.resource[semconv.RANK])
        if int(s.attributes.get(semconv.STEP, -1)) == step and (
            rank not in first or s.start_ns < first[rank].start_ns
        ):
            first[rank] = s
    stage: dict[int, int] = {}

    def stage_of(rank: int, depth: int = 0) -> int:
        if rank in stage or depth > len(first):
            return stage.get(rank, -1)
        s = first.get(rank)
        if s is None:
            return -1
        if s.name.endswith(semconv.OP_SEND):
            stage[rank] = 0
        else:
            before = stage_of(int(s.attributes[semconv.COLLECTIVE_PEER]), depth + 1)
            stage[rank] = before + 1 if before >= 0 else -1
        return stage[rank]

    by_stage: dict[int, list[str]] = {}
    for rank in sorted(latest):
        st = stage_of(rank)
        if st >= 0 and st not in by_stage:
            by_stage[st] = [
                str(n) for n in latest[rank].attributes.get(semconv.PIPELINE_LAYERS, [])
            ]
    if sorted(by_stage) != list(range(stages)):
        return []
    return [name for st in range(stages) for name in by_stage[st]]


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f} ms"


def run_advise(args: argparse.Namespace) -> int:
    try:
        a = advice(args.spans, args.job)
    except AdviseError as exc:
        print(f"skewtrace advise: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(a))
        return 0
    join = "/".join
    print(
        f"job {a['job']}: stage {a['stage']} is a stage_imbalance ({a['verdict']}, step "
        f"{a['step']})"
    )
    print(
        f"now:     {join(map(str, a['layers_now']))} layers per stage, split points "
        f"{','.join(map(str, a['split_points_now']))}"
    )
    print(
        f"advised: {join(map(str, a['layers_advised']))} layers per stage, split points "
        f"{','.join(map(str, a['split_points']))}"
    )
    print(f"--split-points {','.join(map(str, a['split_points']))}")
    print("stage  layers now -> advised  first layer (its stage now)  layer time now -> advised")
    for s, (n0, n1, first, owner, c0, c1) in enumerate(
        zip(
            a["layers_now"],
            a["layers_advised"],
            a["first_layer_advised"],
            a["first_layer_stage_now"],
            a["stage_seconds_now"],
            a["stage_seconds_advised"],
            strict=True,
        )
    ):
        where = f"{first} ({owner})"
        print(f"{s:>5}  {n0:>10} -> {n1:<7}  {where:<27}  {_ms(c0):>14} -> {_ms(c1)}")
    share = f" ({100 * a['saving_s'] / a['step_s']:.0f}% of the step)" if a["step_s"] > 0 else ""
    print(
        f"slowest stage {_ms(max(a['stage_seconds_now']))} -> "
        f"{_ms(max(a['stage_seconds_advised']))} per step; the step replay predicts "
        f"{_ms(a['saving_s'])} saved per step{share}"
    )
    if not a["recommended"]:
        print(
            f"not recommended: the step replay's saving is under the step's naming bar "
            f"({_ms(a['min_saving_s'])}), so the verdict's fix does not propose it; re-measure "
            "on a quieter step or after the other causes are fixed"
        )
    return 0
