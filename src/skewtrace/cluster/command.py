"""``skewtrace demo``'s command line, apart from the demo itself (:mod:`skewtrace.cluster.demo`),
which is imported only when the command runs: it needs ``rich`` (the ``demo`` extra). The
console script (:mod:`skewtrace.cli`) imports this module only when the command is ``demo``
(or when it builds every subcommand's parser), so a training job and the other commands
(``skewtrace pacer``, ``report``, ``timeline``) load nothing of :mod:`skewtrace.cluster`."""

from __future__ import annotations

import argparse

from skewtrace._options import warn_deprecated
from skewtrace.cluster.defaults import (
    COLLECTOR_CONFIG,
    DEFAULT_FABRIC_SCENARIO,
    DEFAULT_LOOPBACK_SCENARIO,
    EXAMPLE,
)
from skewtrace.cluster.scenarios import PRESETS


def _run_demo(args: argparse.Namespace) -> int:
    try:
        from skewtrace.cluster.demo import run_demo
    except ImportError as exc:
        raise SystemExit(
            f"skewtrace demo needs the demo extra ({exc.name} is missing): "
            "pip install 'skewtrace[demo]'"
        ) from exc
    return run_demo(args)


def add_arguments(demo: argparse.ArgumentParser) -> None:
    """The demo's flags, on the ``demo`` subparser that :mod:`skewtrace.cli` made."""
    demo.add_argument(
        "--otelcol",
        default=None,
        metavar="PATH",
        help="the otelcol-skewtrace binary (default: $SKEWTRACE_OTELCOL, a checkout's "
        "build/otelcol-skewtrace, otelcol-skewtrace on PATH, the cache; built there with Go "
        "when none exists)",
    )
    demo.add_argument(
        "--collector-config",
        default=None,
        metavar="PATH",
        help=f"the collector config (default: the package's {COLLECTOR_CONFIG})",
    )
    demo.add_argument(
        "--example",
        default=None,
        metavar="PATH",
        help=f"the training script (default: the package's {EXAMPLE})",
    )
    presets = ", ".join(f"{k} ({v})" for k, v in PRESETS.items())
    demo.add_argument(
        "--scenario",
        action="append",
        default=None,
        metavar="FAULT",
        help="a fault to inject, KIND:TARGET:AMOUNT[@START[:END]] or a preset; repeat to "
        "combine. Kinds: compute/data RANK:SECONDS, jitter RANKS:SECONDS, hetero NODE:FACTOR, "
        "rack SWITCH:SECONDS, nic NODE:MBIT, uplink SWITCH:MBIT. Presets: "
        f"{presets}. Default: {DEFAULT_FABRIC_SCENARIO} on the fabric, "
        f"{DEFAULT_LOOPBACK_SCENARIO} on loopback",
    )
    demo.add_argument(
        "--fabric",
        choices=("auto", "netns", "loopback"),
        default="auto",
        help="netns: the emulated leaf/spine fabric (root, iproute2); loopback: every rank on "
        "this host; auto (default): the fabric where it can be built",
    )
    demo.add_argument("--leaves", type=int, default=3, help="leaf switches (default 3)")
    demo.add_argument("--nodes-per-leaf", type=int, default=2, help="(default 2)")
    demo.add_argument("--ranks-per-node", type=int, default=1, help="(default 1)")
    demo.add_argument("--nic-mbit", type=float, default=800.0, help="NIC rate (default 800)")
    demo.add_argument(
        "--uplink-mbit", type=float, default=800.0, help="each leaf's uplink rate (default 800)"
    )
    demo.add_argument("--steps", type=int, default=60, help="steps per run (default 60)")
    demo.add_argument(
        "--pacing",
        choices=("off", "on", "both"),
        default="both",
        help="run with pacing off, on, or both (default both: --pairs pairs of runs)",
    )
    demo.add_argument(
        "--pairs",
        type=_at_least_one,
        default=2,
        help="with --pacing both, pairs of runs (off, on), in alternating order: off, on, on, "
        "off, ... so that the machine's drift over the runs favours neither (default 2)",
    )
    demo.add_argument("--job-id", default=None, help="prefix of the runs' job ids")
    demo.add_argument("--workdir", default=None, help="where logs, spans and the report go")
    demo.add_argument("--quiet", action="store_true", help="no live view")
    _duration(demo, "--settle", 4.0, "wait after training for the last spans and metrics")
    _duration(demo, "--timeout", 600.0, "give up on the training run after this long")
    demo.set_defaults(run=_run_demo)


def _duration(parser: argparse.ArgumentParser, stem: str, default_s: float, what: str) -> None:
    """``STEM-millis`` (and the deprecated ``STEM-s``, in seconds) into ``args.STEM_s``."""
    dest = stem.lstrip("-").replace("-", "_") + "_s"
    flag, old = f"{stem}-millis", f"{stem}-s"

    def millis(raw: str) -> float:
        return float(raw) / 1000.0

    def seconds(raw: str) -> float:
        warn_deprecated(old, flag, " (milliseconds; the old name took seconds)")
        return float(raw)

    parser.add_argument(
        flag,
        dest=dest,
        type=millis,
        default=default_s,
        metavar="MILLIS",
        help=f"{what} (default {default_s * 1000:g})",
    )
    parser.add_argument(old, dest=dest, type=seconds, help=argparse.SUPPRESS)


def _at_least_one(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {raw!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1, got {value}")
    return value
