"""tools/eval_tables.py: the splice of a benchmark's table between docs/evaluation.md's markers
(pure functions on strings; no benchmark runs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("eval_tables", REPO_ROOT / "tools/eval_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["eval_tables"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


et = _load()

DOC = """# Title

Some text | with a bar.

<!-- eval:alpha -->
| a | b |
|---|---|
| 1 | 2 |

<!-- /eval:alpha -->

Between.

<!-- eval:beta -->
| old |
|---|

<!-- /eval:beta -->
Trailing text without a newline at the end"""

OUTPUT = """generator whatif-gen-1
| job | figure | time |
|---|---|---|
| small-1 | 1.00 | 3 s |
| large-2 | 1.17 | 90 s |
SUMMARY: 2 of 2 jobs met both targets

| scenario | change |
|---|---|
| jitter | -10.5% |
"""


def test_splice_replaces_only_the_text_between_the_markers() -> None:
    table = ["| a | b |", "|---|---|", "| 3 | 4 |", "| 5 | 6 |"]
    out = et.splice(DOC, "alpha", table)
    start, end = DOC.index("<!-- eval:alpha -->\n"), DOC.index("<!-- /eval:alpha -->")
    assert out.startswith(DOC[: start + len("<!-- eval:alpha -->\n")])
    assert out.endswith(DOC[end:])
    assert "| 3 | 4 |\n| 5 | 6 |\n\n<!-- /eval:alpha -->" in out
    assert "| 1 | 2 |" not in out
    # Splicing the table that is there changes nothing, byte for byte.
    assert et.splice(DOC, "alpha", ["| a | b |", "|---|---|", "| 1 | 2 |"]) == DOC
    assert et.splice(out, "beta", ["| old |", "|---|"]) == out


def test_splice_keeps_crlf_line_ends() -> None:
    doc = DOC.replace("\n", "\r\n")
    out = et.splice(doc, "beta", ["| new |", "|---|", "| x |"])
    assert "<!-- eval:beta -->\r\n| new |\r\n|---|\r\n| x |\r\n\r\n<!-- /eval:beta -->" in out
    assert out.replace("| new |\r\n|---|\r\n| x |", "| old |\r\n|---|") == doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (DOC.replace("<!-- eval:alpha -->", ""), "no <!-- eval:alpha -->"),
        (DOC.replace("<!-- /eval:alpha -->", ""), "no <!-- /eval:alpha -->"),
        (DOC + "\n<!-- eval:alpha -->\n", "more than once"),
        ("<!-- /eval:alpha -->\n| a |\n<!-- eval:alpha -->\n", "comes before"),
    ],
    ids=["no-opening", "no-closing", "twice", "reversed"],
)
def test_a_marker_missing_repeated_or_out_of_order_fails(doc: str, message: str) -> None:
    with pytest.raises(et.EvalTablesError, match=message):
        et.splice(doc, "alpha", ["| a |", "|---|"])


def test_a_marker_inside_a_line_is_not_a_marker() -> None:
    doc = "see `<!-- eval:alpha -->` here\n<!-- eval:alpha -->\n| a |\n\n<!-- /eval:alpha -->\n"
    assert et.splice(doc, "alpha", ["| b |"]) == doc.replace("| a |", "| b |")


def test_tables_are_runs_of_lines_starting_with_a_bar() -> None:
    tables = et.markdown_tables(OUTPUT)
    assert [t[0] for t in tables] == ["| job | figure | time |", "| scenario | change |"]
    assert tables[1][-1] == "| jitter | -10.5% |"


def test_the_kth_table_with_columns_left_out_and_rows_kept() -> None:
    second = et.Region("x", ("b.py",), table=2)
    assert et.table_for(OUTPUT, second) == [
        "| scenario | change |",
        "|---|---|",
        "| jitter | -10.5% |",
    ]
    dropped = et.Region("x", ("b.py",), drop_columns=("time",))
    assert et.table_for(OUTPUT, dropped) == [
        "| job | figure |",
        "|---|---|",
        "| small-1 | 1.00 |",
        "| large-2 | 1.17 |",
    ]
    large = et.Region("x", ("b.py",), drop_columns=("time",), rows=r"large-")
    assert et.table_for(OUTPUT, large)[2:] == ["| large-2 | 1.17 |"]
    others = et.Region("x", ("b.py",), drop_columns=("time",), rows=r"(?!large-)")
    assert et.table_for(OUTPUT, others)[2:] == ["| small-1 | 1.00 |"]


@pytest.mark.parametrize(
    ("output", "region", "message"),
    [
        (OUTPUT, et.Region("x", ("b.py",), table=3), "2 markdown table"),
        ("no table here\n", et.Region("x", ("b.py",)), "0 markdown table"),
        (OUTPUT, et.Region("x", ("b.py",), drop_columns=("seconds",)), "no column 'seconds'"),
        (OUTPUT, et.Region("x", ("b.py",), rows=r"huge-"), "no row"),
        (OUTPUT + "FAIL: small-1\n", et.Region("x", ("b.py",)), "FAIL: small-1"),
    ],
    ids=["too-few-tables", "no-table", "no-column", "no-row", "fail"],
)
def test_a_missing_table_or_a_failed_run_fails(output: str, region: object, message: str) -> None:
    with pytest.raises(et.EvalTablesError, match=message):
        et.table_for(output, region)


def test_from_output_splices_a_saved_output_and_dry_run_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "evaluation.md"
    doc.write_bytes(b"x\r\n<!-- eval:scenarios -->\n| old |\n<!-- /eval:scenarios -->\nend")
    saved = tmp_path / "out.txt"
    saved.write_text("| scenario | right |\n|---|---|\n| nic | 2/2 |\n")
    args = ["--doc", str(doc), "--from-output", "scenarios", str(saved)]
    assert et.main([*args, "--dry-run"]) == 0
    assert "+| nic | 2/2 |" in capsys.readouterr().out
    assert b"| old |" in doc.read_bytes()
    assert et.main(args) == 0
    assert doc.read_bytes() == (
        b"x\r\n<!-- eval:scenarios -->\n| scenario | right |\n|---|---|\n| nic | 2/2 |\n\n"
        b"<!-- /eval:scenarios -->\nend"
    )
    assert et.main(["--doc", str(doc), "--from-output", "nosuch", str(saved)]) == 1
    assert "no region 'nosuch'" in capsys.readouterr().err


def test_a_region_kept_by_hand_is_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "evaluation.md"
    doc.write_text("<!-- eval:no-harm -->\n| a |\n<!-- /eval:no-harm -->\n")
    assert et.main(["--only", "no-harm", "--doc", str(doc)]) == 1
    assert "prints no markdown table" in capsys.readouterr().err
    assert et.main(["--only", "no-harm", "--from-output", "no-harm", str(doc)]) == 1


def test_every_region_is_in_the_document_as_the_tool_writes_it() -> None:
    text = (REPO_ROOT / "docs" / "evaluation.md").read_text()
    names = [region.name for region in et.REGIONS]
    assert len(set(names)) == len(names)
    for name in names:
        start, end = et.region_span(text, name)
        tables = et.markdown_tables(text[start:end])
        assert len(tables) == 1, name
        assert et.splice(text, name, tables[0]) == text, name
