"""The package's layout: the rank side (skewtrace.rank, what a training process imports) never
loads the service side (the controller, timeline, report, importer and fabric emulator), the
console script loads only the command it runs, and the old module paths still import, with a
DeprecationWarning (issue 47, item 6)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import skewtrace

REPO_ROOT = Path(__file__).resolve().parent.parent
SRC = REPO_ROOT / "src" / "skewtrace"

SERVICE = (
    "skewtrace.controller",
    "skewtrace.timeline",
    "skewtrace.report",
    "skewtrace.importer",
    "skewtrace.cluster",
    "skewtrace.cli",
)
# Nothing of the service side is loaded or imported by a rank (the pacer's answer format,
# skewtrace.decision, is shared and lives at the top).
SHARED_WITH_THE_SERVICE: set[str] = set()


def _loaded(code: str, prefixes: tuple[str, ...]) -> list[str]:
    probe = (
        f"{code}\nimport sys\nprint(sorted(m for m in sys.modules for p in {prefixes!r} "
        "if m == p or m.startswith(p + '.')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    loaded: list[str] = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    return loaded


def test_skewtrace_pacer_help_imports_no_cluster_module() -> None:
    code = (
        "import contextlib, io\nfrom skewtrace import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        cli.main(['pacer', '--help'])\n    except SystemExit:\n        pass"
    )
    assert _loaded(code, ("skewtrace.cluster",)) == []


def test_skewtrace_help_lists_demo_without_its_module() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\nfrom skewtrace import cli\ntry:\n    cli.main(['--help'])\n"
            "except SystemExit:\n    pass\n"
            "print([m for m in sys.modules if m.startswith('skewtrace.cluster')])",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "demo" in result.stdout and "the main job" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_the_demo_command_still_parses_its_flags() -> None:
    from skewtrace.cli import build_parser

    args = build_parser("demo").parse_args(["demo", "--steps", "7", "--fabric", "loopback"])
    assert (args.steps, args.fabric) == (7, "loopback")


@pytest.mark.slow  # a rank instrumented in a fresh interpreter (torch): make test
def test_instrumenting_a_rank_loads_no_service_module() -> None:
    """The rank's whole session: instrument (with the HTTP pacing client, which starts once the
    identity is known), a step, uninstrument; the rebalancing sampler too."""
    pytest.importorskip("torch")
    code = (
        "import os\n"
        "os.environ.update(OTEL_TRACES_EXPORTER='none', OTEL_METRICS_EXPORTER='none',\n"
        "                  SKEWTRACE_PACER_URL='http://127.0.0.1:9', SKEWTRACE_JOB_ID='layout')\n"
        "import torch, skewtrace\n"
        "from skewtrace.rank.rebalance_sampler import ShareSampler\n"
        "model = torch.nn.Linear(2, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "skewtrace.instrument(model=model, optimizer=optimizer)\n"
        "model(torch.ones(1, 2)).sum().backward()\n"
        "optimizer.step()\n"
        "skewtrace.flush()\n"
        "skewtrace.uninstrument()\n"
    )
    loaded = set(_loaded(code, SERVICE))
    assert loaded <= SHARED_WITH_THE_SERVICE, sorted(loaded - SHARED_WITH_THE_SERVICE)


def test_no_rank_module_imports_the_service_side() -> None:
    """Statically, lazy imports included: every import in src/skewtrace/rank/."""
    problems = []
    for path in sorted((SRC / "rank").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                service = any(name == s or name.startswith(s + ".") for s in SERVICE)
                shared = name in SHARED_WITH_THE_SERVICE
                if service and not shared:
                    problems.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {name}")
    assert problems == []


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("skewtrace.rebalance", "skewtrace.rank.rebalance_sampler", "ShareSampler"),
        ("skewtrace.instrumentor", "skewtrace.rank.instrumentor", "SkewtraceInstrumentor"),
        ("skewtrace.config", "skewtrace.rank.config", "ConfigError"),
        ("skewtrace.topology", "skewtrace.rank.topology", "discover_topology"),
        ("skewtrace.topology.slurm_conf", "skewtrace.rank.topology.slurm_conf", "__name__"),
        ("skewtrace.pacer", "skewtrace.rank.pacing_client", "PacingClient"),
        ("skewtrace.pacer.client", "skewtrace.rank.pacing_client", "PacingClient"),
        ("skewtrace.demo_command", "skewtrace.cluster.command", "add_arguments"),
    ],
)
def test_old_module_paths_import_the_new_module_with_a_warning(
    old: str, new: str, name: str
) -> None:
    target = importlib.import_module(new)
    for key in [k for k in sys.modules if k == old or k.startswith(old + ".")]:
        del sys.modules[key]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        # skewtrace.pacer was a package: a package of the module's names.
        assert module is target or old == "skewtrace.pacer"
        assert getattr(module, name) is getattr(target, name)
        messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
        assert f"{old} is deprecated: it moved to {new}" in messages, messages
    finally:
        for key in [k for k in sys.modules if k == old or k.startswith(old + ".")]:
            del sys.modules[key]


def test_the_old_import_line_in_user_code_warns_there() -> None:
    """Where users see it: the warning points at their import, so Python's default filter
    (DeprecationWarning shown in __main__) shows it."""
    result = subprocess.run(
        [sys.executable, "-c", "from skewtrace.rebalance import ShareSampler"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "<string>:1: DeprecationWarning: skewtrace.rebalance is deprecated" in result.stderr


def test_the_instrumentor_entry_point_and_its_old_value_load_one_class() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    value = project["entry-points"]["opentelemetry_instrumentor"]["skewtrace"]
    module, _, attr = value.partition(":")
    assert module == "skewtrace.rank.instrumentor"
    current = getattr(importlib.import_module(module), attr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        # What an install made before the move still names.
        old = importlib.import_module("skewtrace.instrumentor").SkewtraceInstrumentor
    assert old is current
    assert skewtrace.SkewtraceInstrumentor is current


def test_one_rebalance_module_per_side_named_for_what_it_is() -> None:
    rebalance = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*rebalance*.py"))
    assert rebalance == ["controller/policies/rebalance.py", "rank/rebalance_sampler.py"]


def test_the_top_level_holds_only_shared_modules_and_the_entry_points() -> None:
    """A new module at the top belongs to one side's room unless both sides import it."""
    top = sorted(p.name for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists())
    assert top == [
        "__init__.py",  # skewtrace.instrument() and the moved-module aliases
        "_ids.py",  # trace and span IDs: the rank's export, the timeline
        "_log_limit.py",  # repeat-limited logging: the rank, the timeline
        "_options.py",  # settings as dataclass fields: the rank's config, the CLI, services
        "_ports.py",  # free ports: the emulator, the importer
        "_promnames.py",  # Prometheus names for semconv
        "_registry_instruments.py",  # observable instruments: the rank, the controller
        "_resources.py",  # the package's data and the collector binary: demo, importer
        "cli.py",  # the console script (service side)
        "cluster",
        "controller",
        "decision.py",  # the pacer's answer body: the controller writes it, the rank reads it
        "importer",
        "rank",
        "remedy",  # the remedies' pure functions: the rank's sampler, the Collector's twin, advice
        "report",
        "semconv.py",
        "timeline",
        "version.py",
    ]


def test_a_users_pacing_client_is_a_rank_pacer() -> None:
    """instrument(pacing_client=...): current_delay is all it needs; the rest where it has it."""
    from skewtrace.rank.pacing_client import PacingClient, as_rank_pacer

    class DelayOnly:
        def current_delay(self) -> tuple[float, int]:
            return 0.01, 3

    class Full(DelayOnly):
        step_started_at: float | None = None

        def current_hold(self, groups: list[str]) -> float:
            return 0.02 if "dp0" in groups else 0.0

        def current_shares(self) -> tuple[dict[int, float] | None, int]:
            return {0: 0.4, 1: 0.6}, 5

    plain = as_rank_pacer(DelayOnly())
    plain.note_step_start(12.5)
    assert plain.current_delay() == (0.01, 3)
    assert plain.current_hold(["dp0"]) == 0.0
    assert plain.current_shares() == (None, 0)

    source = Full()
    full = as_rank_pacer(source)
    full.note_step_start(12.5)
    assert source.step_started_at == 12.5
    assert full.current_hold(["dp0"]) == 0.02
    assert full.current_shares() == ({0: 0.4, 1: 0.6}, 5)

    client = PacingClient("http://127.0.0.1:9", "job", 0, max_delay_s=0.05)
    assert as_rank_pacer(client) is client
    client.note_step_start(3.0)
    assert client.step_started_at == 3.0


def test_the_remedies_are_pure_functions_of_the_standard_library() -> None:
    """skewtrace.remedy is imported by a rank's sampler, the CLI and the benchmarks alike: it
    loads neither torch nor any module of the service side."""
    code = "import skewtrace.remedy.work_split, skewtrace.remedy.partition"
    assert _loaded(code, ("torch", *SERVICE)) == []
