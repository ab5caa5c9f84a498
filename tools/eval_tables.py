"""Regenerate the tables of docs/evaluation.md from the benchmarks that print them.

Each table of docs/evaluation.md that a benchmark's figures make sits between two markers,

    <!-- eval:NAME -->
    | ... |

    <!-- /eval:NAME -->

and :data:`REGIONS` says, per NAME, the command line that makes it (run from the repository
root, with this interpreter), and which markdown table of its stdout fills the region (the
k-th run of consecutive lines that start with ``|``), with the columns it leaves out and the
rows it keeps. Only the text between a region's markers changes; everything else in the file
stays byte for byte as it was.

Some benchmarks print their figures as lines, not as a markdown table (``no_harm.py``,
``collision.py``, ``sim_pacing.py``): their regions are assembled by hand from those lines,
and this tool splices them only from a file (``--from-output``), never by running the
command.

    python tools/eval_tables.py --list                     # the regions and their commands
    python tools/eval_tables.py                            # run every command, splice
    python tools/eval_tables.py --only scenarios --dry-run # one region; print the diff only
    python tools/eval_tables.py --from-output whatif-corpus saved.txt   # no command run
    python tools/eval_tables.py --save-output /tmp/eval    # also keep each command's stdout

It fails (exit status 1, a message naming the region) when a command exits non-zero or prints
a line starting with FAIL, when a marker is missing, repeated or out of order, and when the
output has no k-th table or the table lacks a column to leave out. Nothing is written unless
every selected region could be spliced. The commands take from minutes to hours (most need
root and network namespaces); see each benchmark's docstring.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "evaluation.md"


@dataclass(frozen=True)
class Region:
    """One marked table of the document and where it comes from."""

    name: str
    """The NAME of ``<!-- eval:NAME -->``."""

    argv: tuple[str, ...]
    """The command line after ``python``, run from the repository root."""

    table: int = 1
    """Which markdown table of the command's stdout (1: the first)."""

    drop_columns: tuple[str, ...] = ()
    """Header cells whose columns are left out (figures that only say how long a run took)."""

    rows: str | None = None
    """Keep only the data rows whose first cell matches this regular expression (re.match)."""

    by_hand: str = ""
    """Non-empty where the command prints no markdown table: how the region's table is
    assembled from its output. Such a region is spliced only with ``--from-output``."""

    @property
    def command(self) -> str:
        return " ".join(("python", *self.argv))


REGIONS: tuple[Region, ...] = (
    Region("whatif-corpus", ("benchmarks/whatif_corpus.py",), drop_columns=("time",)),
    # The large jobs come with the whole corpus; only their rows fill this region.
    Region(
        "whatif-large",
        ("benchmarks/whatif_corpus.py", "--large"),
        drop_columns=("time",),
        rows=r"large-",
    ),
    Region("diagnosis-table", ("benchmarks/diagnosis_table.py", "--seeds", "3")),
    # benchmarks/remedies.py: the headed pipeline's gains by micro-batches, and the corpus's
    # predicted savings beside the realized ones.
    Region("remedies-stage", ("benchmarks/remedies.py", "--sections", "proofs")),
    Region("remedies-corpus", ("benchmarks/remedies.py", "--sections", "corpus")),
    # One run of scenarios.py fills both regions (the second table: pacing off and on).
    Region("scenarios", ("benchmarks/scenarios.py", "--repeat", "2", "--pacing")),
    Region("scenarios-pacing", ("benchmarks/scenarios.py", "--repeat", "2", "--pacing"), table=2),
    Region(
        "no-harm",
        ("benchmarks/no_harm.py",),
        by_hand="a row per scenario and arm from the 'round N SCENARIO ARM: ...' lines and the "
        "'SCENARIO ARM: controlled over observed ...' medians",
    ),
    Region(
        "collision",
        ("benchmarks/collision.py",),
        by_hand="a row per round from the 'round N: step time A alone ...' lines",
    ),
    Region(
        "collision-arms",
        (
            "benchmarks/collision.py",
            "--controlled",
            "--rounds",
            "2",
            "--steps",
            "80",
            "--warmup",
            "20",
            "--controlled-steps",
            "1400",
            "--controlled-warmup",
            "900",
        ),
        by_hand="a row per round from the 'round N: ...' lines",
    ),
    Region(
        "collision-guarded",
        (
            "benchmarks/collision.py",
            "--controlled",
            "--arm",
            "interleave",
            "--interleave-effect-pairs",
            "3",
            "--controlled-steps",
            "1800",
            "--controlled-warmup",
            "600",
        ),
        by_hand="a row per round from the 'round N: ...' lines, the guard's judgements and "
        "the decision traces (one run per row)",
    ),
    Region(
        "collision-fair",
        (
            "benchmarks/collision.py",
            "--uplink-sharing",
            "fair",
            "--controlled",
            "--arm",
            "interleave",
            "--interleave-effect-pairs",
            "3",
            "--rounds",
            "2",
            "--controlled-steps",
            "1800",
            "--controlled-warmup",
            "600",
        ),
        by_hand="a row per round from the 'round N: ...' and spell lines",
    ),
    Region(
        "collision-sets",
        (
            "benchmarks/collision.py",
            "--layout",
            "sets",
            "--arm",
            "interleave",
            "--interleave-effect-pairs",
            "3",
            "--controlled-steps",
            "600",
            "--controlled-warmup",
            "100",
            "--sample-time",
            "0.003",
            "--set-offset",
            "0.08",
        ),
        by_hand="a row per round from the 'round N: ...' lines and the hand-set offset's gain",
    ),
    Region(
        "sim-pacing",
        ("benchmarks/sim_pacing.py", "--seed", "1"),
        by_hand="its plain-text table, run with --seed 1 and --seed 2, both figures in a cell",
    ),
    Region(
        "sim-interleave",
        ("benchmarks/sim_pacing.py", "--interleave-offline", "--seed", "1"),
        by_hand="its plain-text table, run with --seed 1, 2 and 3, one change per seed",
    ),
)


class EvalTablesError(Exception):
    """What went wrong, in words meant for the person running the tool."""


_FAIL = re.compile(r"^\s*FAIL\b", re.MULTILINE)
_SEPARATOR_CELL = re.compile(r":?-+:?")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


def region_of(name: str) -> Region:
    for region in REGIONS:
        if region.name == name:
            return region
    known = ", ".join(r.name for r in REGIONS)
    raise EvalTablesError(f"no region {name!r} (known: {known})")


def markdown_tables(text: str) -> list[list[str]]:
    """Every markdown table of ``text``: each a run of consecutive lines starting with ``|``."""
    tables: list[list[str]] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line.rstrip())
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def cells(line: str) -> list[str]:
    """The cells of one table line (``| a | b |`` -> ``["a", "b"]``)."""
    inner = line.strip()
    inner = inner.removeprefix("|")
    if inner.endswith("|") and not inner.endswith("\\|"):
        inner = inner[:-1]
    return [cell.strip() for cell in _CELL_SPLIT.split(inner)]


def _line(row: Sequence[str]) -> str:
    if row and all(_SEPARATOR_CELL.fullmatch(cell) for cell in row):
        return "|" + "|".join(row) + "|"
    return "| " + " | ".join(row) + " |"


def select(table: Sequence[str], region: Region) -> list[str]:
    """The lines of ``table`` that fill ``region``: its columns left out, its rows kept."""
    if not region.drop_columns and region.rows is None:
        return list(table)
    if len(table) < 2:
        raise EvalTablesError(f"{region.name}: the table has no header and separator")
    header = cells(table[0])
    missing = [name for name in region.drop_columns if name not in header]
    if missing:
        raise EvalTablesError(
            f"{region.name}: the table has no column {', '.join(map(repr, missing))} to leave "
            f"out (header: {table[0]})"
        )
    keep = [i for i, name in enumerate(header) if name not in region.drop_columns]
    out: list[str] = []
    for number, line in enumerate(table):
        row = cells(line)
        if number >= 2 and region.rows is not None and not re.match(region.rows, row[0]):
            continue
        out.append(_line([row[i] for i in keep if i < len(row)]))
    if region.rows is not None and len(out) == 2:
        raise EvalTablesError(f"{region.name}: no row of the table matches {region.rows!r}")
    return out


def table_for(output: str, region: Region) -> list[str]:
    """The lines of ``region``'s table in a command's ``output``; raises when the output says
    FAIL or has too few tables."""
    failed = _FAIL.search(output)
    if failed:
        line = output[failed.start() :].splitlines()[0].strip()
        raise EvalTablesError(f"{region.name}: the output says {line!r}")
    tables = markdown_tables(output)
    if len(tables) < region.table:
        raise EvalTablesError(
            f"{region.name}: the output has {len(tables)} markdown table(s), the region is "
            f"table {region.table}"
        )
    return select(tables[region.table - 1], region)


def _marker_lines(doc: str, marker: str) -> list[int]:
    """Offsets of the lines of ``doc`` that are exactly ``marker`` (surrounding blanks aside)."""
    found: list[int] = []
    offset = 0
    for line in doc.splitlines(keepends=True):
        if line.strip() == marker:
            found.append(offset)
        offset += len(line)
    return found


def region_span(doc: str, name: str) -> tuple[int, int]:
    """``(start, end)``: the text of ``doc`` between the end of NAME's opening marker line and
    the start of its closing marker line."""
    opening, closing = f"<!-- eval:{name} -->", f"<!-- /eval:{name} -->"
    opens, closes = _marker_lines(doc, opening), _marker_lines(doc, closing)
    if not opens or not closes:
        absent = " and ".join(m for m, at in ((opening, opens), (closing, closes)) if not at)
        raise EvalTablesError(f"{name}: the document has no {absent} line")
    if len(opens) > 1 or len(closes) > 1:
        raise EvalTablesError(f"{name}: the document has its markers more than once")
    newline = doc.find("\n", opens[0])
    start = len(doc) if newline < 0 else newline + 1
    if closes[0] < start:
        raise EvalTablesError(f"{name}: {closing} comes before {opening}")
    return start, closes[0]


def splice(doc: str, name: str, table: Sequence[str]) -> str:
    """``doc`` with the text between NAME's markers replaced by ``table``'s lines and a blank
    line (so that no renderer reads the closing marker as a row); the rest is left as it was,
    byte for byte."""
    if not table:
        raise EvalTablesError(f"{name}: no table to splice")
    start, end = region_span(doc, name)
    newline = "\r\n" if doc[:start].endswith("\r\n") else "\n"
    return doc[:start] + "".join(line + newline for line in table) + newline + doc[end:]


def run_command(region: Region, python: str, save: Path | None) -> str:
    """The command's stdout (its lines also echoed to stderr as they come); raises when it
    exits non-zero."""
    argv = [python, *region.argv]
    print(f"$ {region.command}", file=sys.stderr, flush=True)
    with subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            print(line, end="", file=sys.stderr, flush=True)
    output = "".join(lines)
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        (save / f"{region.name}.txt").write_text(output)
    if proc.returncode != 0:
        raise EvalTablesError(f"{region.name}: `{region.command}` exited {proc.returncode}")
    return output


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--doc", type=Path, default=DOC, help="the document (docs/evaluation.md)")
    parser.add_argument(
        "--only", action="append", default=[], metavar="NAME", help="this region (repeatable)"
    )
    parser.add_argument(
        "--from-output",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "FILE"),
        help="splice NAME's table from a saved output; runs nothing (repeatable)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")
    parser.add_argument("--list", action="store_true", help="the regions and their commands")
    parser.add_argument(
        "--save-output", type=Path, metavar="DIR", help="keep each command's stdout here"
    )
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run with")
    return parser.parse_args(argv)


def _list() -> None:
    for region in REGIONS:
        how = f"by hand: {region.by_hand}" if region.by_hand else f"table {region.table}"
        print(f"{region.name}: {region.command}  ({how})")


def _tables(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each selected region's table, from files or by running the commands."""
    if args.from_output:
        if args.only:
            raise EvalTablesError("--only and --from-output: give one or the other")
        return {
            name: table_for(Path(file).read_text(), region_of(name))
            for name, file in args.from_output
        }
    if args.only:
        chosen = [region_of(name) for name in dict.fromkeys(args.only)]
        by_hand = [r for r in chosen if r.by_hand]
        if by_hand:
            raise EvalTablesError(
                "; ".join(
                    f"{r.name}: `{r.command}` prints no markdown table ({r.by_hand}); splice it "
                    f"with --from-output {r.name} FILE"
                    for r in by_hand
                )
            )
    else:
        chosen = [r for r in REGIONS if not r.by_hand]
        skipped = ", ".join(r.name for r in REGIONS if r.by_hand)
        print(f"not run (kept by hand, see --list): {skipped}", file=sys.stderr)
    doc = args.doc.read_text(encoding="utf-8")
    for region in chosen:  # every marker checked before hours of benchmarks
        region_span(doc, region.name)
    outputs: dict[tuple[str, ...], str] = {}
    tables: dict[str, list[str]] = {}
    for region in chosen:
        if region.argv not in outputs:
            outputs[region.argv] = run_command(region, args.python, args.save_output)
        tables[region.name] = table_for(outputs[region.argv], region)
    return tables


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.list:
        _list()
        return 0
    try:
        with args.doc.open(encoding="utf-8", newline="") as f:
            before = f.read()
        tables = _tables(args)
        after = before
        for name, table in tables.items():
            after = splice(after, name, table)
    except (EvalTablesError, OSError) as e:
        print(f"eval_tables: {e}", file=sys.stderr)
        return 1
    for name, table in tables.items():
        changed = splice(before, name, table) != before
        print(f"{name}: {'changed' if changed else 'unchanged'}")
    if args.dry_run:
        sys.stdout.writelines(
            difflib.unified_diff(
                before.splitlines(keepends=True),
                after.splitlines(keepends=True),
                str(args.doc),
                f"{args.doc} (spliced)",
            )
        )
    elif after != before:
        with args.doc.open("w", encoding="utf-8", newline="") as f:
            f.write(after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
