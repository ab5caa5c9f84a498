"""The policy registry (skewtrace.controller.policies.POLICIES) drives the controller: the
``--policy`` names, the ``skewtrace pacer`` flags and their ``--help`` sections, the service's
configuration, the composition and the documentation. A new policy is one module and one
registry entry; nothing else changes.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from skewtrace.cli import _PACER_OPTIONS, build_parser
from skewtrace.controller.config import PacerConfig
from skewtrace.controller.policies import (
    POLICIES,
    ComposedPolicy,
    build_policy,
    complete_params,
    policy_names,
)
from skewtrace.controller.policies.pacing import PolicyParams
from skewtrace.controller.policies.rebalance import RebalanceParams
from skewtrace.decision import DecisionBody

REPO_ROOT = Path(__file__).resolve().parent.parent
PACING_DOC = REPO_ROOT / "docs" / "pacing.md"


def test_the_registry_is_well_formed() -> None:
    names = [spec.name for spec in POLICIES]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", name) for name in names), names
    types = [spec.params_type for spec in POLICIES]
    assert len(set(types)) == len(types)
    for spec in POLICIES:
        assert dataclasses.is_dataclass(spec.params_type)
        assert spec.params_type.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert spec.summary and spec.docs
        assert spec.build(spec.params_type()).name == spec.name


def test_docs_name_every_policy_and_every_flag() -> None:
    """docs/pacing.md mentions each registered policy by name and each of its parameters by
    its flag (and every other ``skewtrace pacer`` flag): a new one is documented or this
    fails."""
    text = PACING_DOC.read_text()
    missing = [f"`{spec.name}`" for spec in POLICIES if f"`{spec.name}`" not in text]
    missing += [f"`{flag.flag}`" for flag in _PACER_OPTIONS if f"`{flag.flag}`" not in text]
    assert not missing, f"docs/pacing.md does not mention {', '.join(missing)}"
    for spec in POLICIES:
        flags = {flag.field for flag in _PACER_OPTIONS if flag.section is spec.params_type}
        assert flags == {f.name for f in dataclasses.fields(spec.params_type)}


def test_help_has_a_section_per_policy_with_its_flags() -> None:
    subparsers = build_parser()._subparsers
    assert subparsers is not None
    pacer = subparsers._group_actions[0].choices["pacer"]  # type: ignore[attr-defined]
    text = " ".join(pacer.format_help().split())  # argparse wraps lines
    for spec in POLICIES:
        assert f"{spec.title}:" in text
        assert f"{spec.name} ({spec.summary})" in text
        section = text.split(f"{spec.title}:")[1]
        for flag in _PACER_OPTIONS:
            if flag.section is spec.params_type:
                assert flag.flag in section


def test_policies_compose_in_registry_order() -> None:
    everything = ",".join(reversed([spec.name for spec in POLICIES]))
    canonical = ",".join(spec.name for spec in POLICIES)
    assert policy_names(everything) == canonical
    composed = build_policy(everything)
    assert isinstance(composed, ComposedPolicy)
    assert composed.name == canonical
    assert [p.name for p in composed.policies] == [spec.name for spec in POLICIES]


def test_the_config_holds_every_policys_parameters() -> None:
    assert PacerConfig().policy_params == tuple(spec.params_type() for spec in POLICIES)
    pacing = PolicyParams(gain=0.25)
    config = PacerConfig(policy_params=(pacing,))
    assert config.params_for(PolicyParams) is pacing
    assert config.params_for(RebalanceParams) == RebalanceParams()
    assert complete_params([RebalanceParams(), pacing])[0] is pacing
    with pytest.raises(TypeError, match="given twice"):
        complete_params([pacing, pacing])
    with pytest.raises(TypeError, match="not the parameters of a registered policy"):
        complete_params([object()])


# ------------------------------------------------------------------ a new policy

TOY_MODULE = '''
"""A policy the registry has never seen: one module, one registry entry."""

from dataclasses import dataclass

from skewtrace._options import check_fields, option, positive
from skewtrace.controller.policies.base import Outcome


@dataclass(frozen=True)
class ToyParams:
    toy_delay_s: float = option(0.003, check=positive, seconds=True)
    """The delay the toy policy asks of every rank but the highest."""

    def __post_init__(self) -> None:
        check_fields(self)


class ToyPolicy:
    name = "toy"

    def __init__(self, params: ToyParams) -> None:
        self.params = params

    def initial_state(self) -> int:
        return 0

    def decide(self, window, previous: int) -> Outcome:
        ranks = sorted(window.ranks)
        return Outcome(
            reason="toy",
            state=previous + 1,
            active=True,
            delays={rank: self.params.toy_delay_s for rank in ranks[:-1]},
            ranks=len(ranks),
            info={"toy": {"ticks": previous + 1}},
        )
'''

TOY_RUN = """
import contextlib, io, json, sys

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.sdk.metrics import MeterProvider

from skewtrace import semconv
from skewtrace.controller import policies
import toy_policy

# The one registry entry (what a new policy adds to skewtrace/controller/policies/__init__.py).
policies.POLICIES = (
    *policies.POLICIES,
    policies.PolicySpec(
        "toy", toy_policy.ToyParams, toy_policy.ToyPolicy, summary="a test policy", docs="nowhere"
    ),
)

from skewtrace.cli import build_pacer_config, build_parser, main
from skewtrace.controller.service import PacerService

help_text = io.StringIO()
with contextlib.redirect_stdout(help_text):
    try:
        main(["pacer", "--help"])
    except SystemExit:
        pass
parser = build_parser()
args = parser.parse_args(["pacer", "--policy", "toy,pacing", "--toy-delay-millis", "7"])
config, _ = build_pacer_config(args.parser, args, {"SKEWTRACE_PACER_HTTP": "127.0.0.1:0"})

now = [1000.0]
service = PacerService(config, meter_provider=MeterProvider(), clock=lambda: now[0])
totals = {}
for tick in range(12):
    now[0] += 0.5
    request = metrics_service_pb2.ExportMetricsServiceRequest()
    metrics = request.resource_metrics.add().scope_metrics.add().metrics
    for name, value in ((semconv.METRIC_STEP_DURATION, lambda r: 0.1),
                        (semconv.METRIC_RANK_WAIT, lambda r: 0.0 if r == 3 else 0.03),
                        (semconv.METRIC_RANK_LATENESS, lambda r: 0.03 if r == 3 else 0.0)):
        metric = metrics.add(name=name, unit="s")
        metric.histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
        for rank in range(4):
            count, total = totals.get((name, rank), (0, 0.0))
            count, total = count + 5, total + 5 * value(rank)
            totals[(name, rank)] = (count, total)
            point = metric.histogram.data_points.add(
                start_time_unix_nano=1, time_unix_nano=2, count=count, sum=total,
                explicit_bounds=[0.01, 1.0], bucket_counts=[0, count, 0],
            )
            point.attributes.add(key=semconv.JOB_ID).value.string_value = "j"
            point.attributes.add(key=semconv.RANK).value.int_value = rank
    service.ingest(request)
    service.tick()
print(json.dumps({
    "help": help_text.getvalue(),
    "policy_names": config.policy_names,
    "toy_delay_s": config.params_for(toy_policy.ToyParams).toy_delay_s,
    "body": service.decision_body("j"),
}))
"""


def test_a_new_policy_is_one_module_and_one_registry_entry(tmp_path: Path) -> None:
    """A toy policy, its module written here and its entry appended to the registry, and no
    other change: it has flags and a --help section, takes part in --policy and the
    composition, and the unchanged service serves its decisions to the unchanged client."""
    (tmp_path / "toy_policy.py").write_text(textwrap.dedent(TOY_MODULE))
    done = subprocess.run(
        [sys.executable, "-c", TOY_RUN],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "COLUMNS": "100"},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    found["help"] = " ".join(found["help"].split())  # argparse wraps lines
    assert "toy policy (nowhere):" in found["help"]
    assert "--toy-delay-millis" in found["help"]
    assert "toy (a test policy)" in found["help"]
    assert found["policy_names"] == "pacing,toy"
    assert found["toy_delay_s"] == pytest.approx(0.007)
    body = found["body"]
    assert body["policy"] == "pacing,toy" and body["active"] is True
    assert body["toy"] == {"ticks": 12}
    assert set(body["delays"]) == {"0", "1", "2"}  # the toy's, or pacing's where larger
    assert all(delay >= 0.007 for delay in body["delays"].values())
    read = DecisionBody.from_json(body)
    assert read.delay_for(0, 0.05) >= 0.007 and read.delay_for(3, 0.05) == 0.0
