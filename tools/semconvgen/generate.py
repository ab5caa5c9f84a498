#!/usr/bin/env python3
"""Generates skewtrace's name constants and docs tables from ``src/semconv/registry.yaml``.

    python tools/semconvgen/generate.py            # rewrites every generated file
    python tools/semconvgen/generate.py --check    # exits 1 naming each stale file

Writes ``src/skewtrace/semconv.py``, ``src/collector/internal/semconv/semconv.go``,
``tools/loadgen/semconv_gen.go`` and the tables of ``docs/semantic-conventions.md`` between
``<!-- BEGIN GENERATED: <id> -->`` and ``<!-- END GENERATED -->`` (the prose around them is
hand-written). Go output goes through ``gofmt``. Needs Python 3.10+ and PyYAML only; the
Prometheus names come from ``src/skewtrace/_promnames.py``, loaded by path.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = Path("src/semconv/registry.yaml")
PYTHON_OUT = Path("src/skewtrace/semconv.py")
GO_OUT = Path("src/collector/internal/semconv/semconv.go")
LOADGEN_OUT = Path("tools/loadgen/semconv_gen.go")
DOC = Path("docs/semantic-conventions.md")
PROMNAMES = Path("src/skewtrace/_promnames.py")

SOURCE_NOTE = "generated from src/semconv/registry.yaml by tools/semconvgen; do not edit"
KINDS = ("attribute", "span", "metric", "component_metric")
INSTRUMENTS = ("histogram", "gauge", "counter", "updowncounter")
VALUES_SECTION = "values"
BEGIN = re.compile(r"<!-- BEGIN GENERATED: ([a-z0-9-]+) -->\n")
END = "<!-- END GENERATED -->"
PY_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
GO_NAME = re.compile(r"^[A-Z][A-Za-z0-9]*$")
LOADGEN_NAME = re.compile(r"^[a-z][A-Za-z0-9]*$")


class RegistryError(Exception):
    """The registry is malformed; the message names the entry."""


@dataclass
class Value:
    value: str
    python: str
    go: str
    brief: str
    loadgen: str = ""


@dataclass
class Entry:
    name: str
    brief: str
    python: str = ""
    go: str = ""
    loadgen: str = ""
    raw: dict[str, Any] = field(default_factory=dict)
    values: list[Value] = field(default_factory=list)

    def get(self, key: str, default: Any = "") -> Any:
        return self.raw.get(key, default)


@dataclass
class Group:
    id: str
    kind: str
    title: str
    entries: list[Entry]
    raw: dict[str, Any]


@dataclass
class Registry:
    groups: list[Group]

    def attributes(self) -> dict[str, Entry]:
        return {e.name: e for g in self.groups if g.kind == "attribute" for e in g.entries}


# --- loading and checking the registry ---------------------------------------------------------


def _require(raw: dict[str, Any], key: str, where: str) -> Any:
    if key not in raw or raw[key] in (None, ""):
        raise RegistryError(f"{where}: missing `{key}`")
    return raw[key]


def _component_metrics(root: Path, group: dict[str, Any]) -> list[Entry]:
    """The instruments an mdatagen metadata.yaml declares under telemetry.metrics."""
    entries = []
    for rel in _require(group, "metadata", group["id"]):
        path = root / rel
        if not path.is_file():
            raise RegistryError(f"group {group['id']}: {rel} does not exist")
        metadata = yaml.safe_load(path.read_text()) or {}
        attributes = metadata.get("attributes", {})
        for key, raw in sorted(metadata.get("telemetry", {}).get("metrics", {}).items()):
            where = f"{rel}: telemetry.metrics.{key}"
            if "sum" in raw:
                instrument = "counter" if raw["sum"].get("monotonic") else "updowncounter"
            else:
                instrument = next((k for k in ("gauge", "histogram") if k in raw), "")
            if not instrument:
                raise RegistryError(f"{where}: neither gauge, sum nor histogram")
            attrs = []
            for name in raw.get("attributes", []):
                enum = attributes.get(name, {}).get("enum")
                attrs.append(
                    f"`{name}`" + (": " + ", ".join(f"`{v}`" for v in enum) if enum else "")
                )
            details = {"instrument": instrument, "unit": _require(raw, "unit", where)}
            details["attribute_cells"] = attrs
            details["note"] = raw.get("extended_documentation", "")
            entries.append(
                Entry(
                    name=group["prefix"] + key,
                    brief=_require(raw, "description", where),
                    raw=details,
                )
            )
    return entries


def load(root: Path) -> Registry:
    path = root / REGISTRY
    document = yaml.safe_load(path.read_text())
    groups = []
    for graw in _require(document, "groups", str(path)):
        gid = _require(graw, "id", "group")
        kind = _require(graw, "kind", f"group {gid}")
        if kind not in KINDS:
            raise RegistryError(f"group {gid}: kind {kind!r} is not one of {KINDS}")
        title = str(_require(graw, "title", gid))
        if kind == "component_metric":
            _require(graw, "prefix", gid)
            groups.append(Group(gid, kind, title, _component_metrics(root, graw), graw))
            continue
        entries = []
        for eraw in _require(graw, "entries", f"group {gid}"):
            name = str(_require(eraw, "name", f"group {gid}"))
            where = f"{gid}/{name}"
            entry = Entry(name=name, brief=str(_require(eraw, "brief", where)), raw=eraw)
            entry.python = _require(eraw, "python", where)
            entry.go = _require(eraw, "go", where)
            entry.loadgen = eraw.get("loadgen", "")
            for vraw in eraw.get("values", []):
                vwhere = f"{where} value {vraw.get('value')!r}"
                entry.values.append(
                    Value(
                        value=str(_require(vraw, "value", where)),
                        python=_require(vraw, "python", vwhere),
                        go=_require(vraw, "go", vwhere),
                        brief=str(_require(vraw, "brief", vwhere)),
                        loadgen=vraw.get("loadgen", ""),
                    )
                )
            if kind == "metric":
                instrument = _require(eraw, "instrument", where)
                if instrument not in INSTRUMENTS:
                    raise RegistryError(f"{where}: instrument {instrument!r} not in {INSTRUMENTS}")
                _require(eraw, "unit", where)
            if kind == "attribute":
                _require(eraw, "type", where)
            entries.append(entry)
        groups.append(Group(gid, kind, title, entries, graw))
    registry = Registry(groups)
    _validate(registry)
    return registry


def _validate(registry: Registry) -> None:
    seen_python: dict[str, str] = {}
    seen_go: dict[str, str] = {}
    seen_loadgen: dict[str, str] = {}
    seen_names: set[tuple[str, str]] = set()
    attributes = registry.attributes()
    ids = [g.id for g in registry.groups]
    if len(set(ids)) != len(ids) or VALUES_SECTION in ids:
        raise RegistryError(f"group ids must be unique and not {VALUES_SECTION!r}: {ids}")

    def constant(
        kind: str, name: str, value: str, seen: dict[str, str], pattern: re.Pattern[str]
    ) -> None:
        if not pattern.match(name):
            raise RegistryError(f"{value}: {kind} constant {name!r} is not a valid name")
        if name in seen:
            raise RegistryError(f"{kind} constant {name} is used by {seen[name]} and {value}")
        seen[name] = value

    for group in registry.groups:
        for e in group.entries:
            key = (group.kind, e.name)
            if key in seen_names:
                raise RegistryError(f"{group.kind} {e.name!r} is registered twice")
            seen_names.add(key)
            named: list[tuple[Entry | Value, str]] = [(v, f"{e.name}={v.value}") for v in e.values]
            for item, what in [(e, e.name), *named] if e.python else []:
                constant("python", item.python, what, seen_python, PY_NAME)
                constant("go", item.go, what, seen_go, GO_NAME)
                constant("loadgen", loadgen_name(item), what, seen_loadgen, LOADGEN_NAME)
            for alternatives in e.get("attributes", []):
                for attr in alternatives if isinstance(alternatives, list) else [alternatives]:
                    if attr not in attributes:
                        raise RegistryError(f"{e.name}: attribute {attr!r} is not registered")
            if e.get("name_values") and e.get("name_values") not in attributes:
                raise RegistryError(f"{e.name}: name_values {e.get('name_values')!r} unknown")
        if group.raw.get("python_all"):
            constant("python", group.raw["python_all"], group.id, seen_python, PY_NAME)
    for group in registry.groups:
        if group.kind == "metric":
            for e in group.entries:
                if not e.python.startswith("METRIC_"):
                    raise RegistryError(f"{e.name}: a metric's python name starts with METRIC_")
                constant("python", prom_constant(e), e.name, seen_python, PY_NAME)


def load_promnames(root: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("_skewtrace_promnames", root / PROMNAMES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prom_constant(e: Entry) -> str:
    return "PROM_" + e.python.removeprefix("METRIC_")


# --- rendering helpers ------------------------------------------------------------------------


def _comment(prefix: str, text: str, width: int = 96) -> list[str]:
    return textwrap.wrap(
        text, width=width, initial_indent=prefix, subsequent_indent=prefix, break_on_hyphens=False
    )


def _instrument_label(e: Entry) -> str:
    label = str(e.get("instrument"))
    return f"{label} 0/1" if e.get("flag") else label


def _attribute_list(e: Entry) -> str:
    parts = []
    for alternatives in e.get("attributes", []):
        keys = alternatives if isinstance(alternatives, list) else [alternatives]
        parts.append(" or ".join(f"`{k}`" for k in keys))
    return ", ".join(parts)


def _describe(e: Entry, group_kind: str) -> str:
    """One line about a constant, for its comment in Python and Go."""
    if group_kind == "attribute":
        return f"{e.name} ({e.get('type')}): {e.brief}"
    if group_kind == "metric":
        return f"{e.name} ({_instrument_label(e)}, {e.get('unit')}): {e.brief}"
    if e.get("name_values"):
        return f"{e.name}<{e.get('name_values')}>: {e.brief}"
    return f"{e.name}: {e.brief}"


# --- Python -----------------------------------------------------------------------------------


def render_python(registry: Registry, prom: ModuleType) -> str:
    out = [
        '"""Names that cross component boundaries: span names, attribute keys and their',
        "well-known values, metric names and their Prometheus names.",
        "",
        *textwrap.wrap(
            f"This module is {SOURCE_NOTE}: to add or change a name, edit the registry and run"
            " ``make generate``. Documented in ``docs/semantic-conventions.md``; the Go collector"
            " has the same constants in ``src/collector/internal/semconv``. Call sites import"
            " these constants instead of writing string literals.",
            width=96,
            break_on_hyphens=False,
        ),
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import NamedTuple",
        "",
        "from skewtrace._promnames import HISTOGRAM_SERIES as HISTOGRAM_SERIES",
        "from skewtrace._promnames import prometheus_label as prometheus_label",
        "from skewtrace._promnames import prometheus_name as prometheus_name",
    ]

    def block(title: str, lines: Iterable[str]) -> None:
        out.append("")
        out.extend(_comment("# ", title))
        out.extend(lines)

    for group in registry.groups:
        if group.kind == "component_metric":
            continue
        lines: list[str] = []
        for e in group.entries:
            lines += _comment("#: ", _describe(e, group.kind))
            lines.append(f'{e.python} = "{e.name}"')
        block(group.title, lines)
        for e in group.entries:
            if e.values:
                lines = []
                for v in e.values:
                    lines += _comment("#: ", v.brief)
                    lines.append(f'{v.python} = "{v.value}"')
                block(f"Values of {e.name}.", lines)
        if group.kind == "metric":
            lines = []
            for e in group.entries:
                name = prom.prometheus_name(e.name, e.get("instrument"), str(e.get("unit")))
                lines.append(f'{prom_constant(e)} = "{name}"')
            block("Their Prometheus names (histograms add HISTOGRAM_SERIES).", lines)
        if group.raw.get("python_all"):
            out.extend(["", f"{group.raw['python_all']} = ("])
            out.extend(f"    {e.python}," for e in group.entries)
            out.append(")")
    out += [
        "",
        "",
        "class MetricSpec(NamedTuple):",
        '    """A metric\'s instrument, unit and description, as the registry gives them:',
        '    instruments are created from these, never from literals of their own."""',
        "",
        "    instrument: str",
        "    unit: str",
        "    description: str",
        "",
        "",
        "#: Every metric of the registry by name.",
        "METRICS: dict[str, MetricSpec] = {",
    ]
    for group in registry.groups:
        if group.kind != "metric":
            continue
        for e in group.entries:
            out += [
                f"    {e.python}: MetricSpec(",
                f"        {json.dumps(str(e.get('instrument')))},",
                f"        {json.dumps(str(e.get('unit')))},",
            ]
            # As ruff formats it: one literal when it fits in 100 columns, else pieces.
            description = metric_description(e)
            pieces = (
                [description]
                if len(json.dumps(description)) + 9 <= 100
                else textwrap.wrap(description, 84, drop_whitespace=False, break_on_hyphens=False)
            )
            out += [f"        {json.dumps(piece)}" for piece in pieces[:-1]]
            out += [f"        {json.dumps(pieces[-1])},", "    ),"]
    out.append("}")
    return "\n".join(out) + "\n"


def metric_description(e: Entry) -> str:
    """A metric's description for its instrument (Prometheus HELP): the registry's brief,
    without markdown."""
    return e.brief.replace("`", "")


# --- Go ---------------------------------------------------------------------------------------


def _go_const_block(comment: str, rows: list[tuple[str, str, str]]) -> list[str]:
    lines = ["", *_comment("// ", comment), "const ("]
    for i, (name, value, doc) in enumerate(rows):
        if i:
            lines.append("")
        lines += _comment("\t// ", f"{name} is {doc}")
        lines.append(f'\t{name} = "{value}"')
    lines.append(")")
    return lines


def render_go(registry: Registry, package: str, name_of: Callable[[Entry | Value], str]) -> str:
    out = ["// Code generated by tools/semconvgen from src/semconv/registry.yaml. DO NOT EDIT.", ""]
    if package == "semconv":
        out += [
            "// Package semconv holds the names that cross skewtrace's component boundaries,",
            "// the same as the Python constants in src/skewtrace/semconv.py and the tables of",
            "// docs/semantic-conventions.md. Edit src/semconv/registry.yaml, then run",
            "// `make generate`.",
        ]
    else:
        out += [
            "// The names skewtrace's instrumentation writes, from the same registry as the",
            "// collector's internal/semconv (which this module cannot import).",
            "",
        ]
    out.append(f"package {package}")
    for group in registry.groups:
        if group.kind == "component_metric":
            continue
        rows = [(name_of(e), e.name, _describe(e, group.kind)) for e in group.entries]
        out += _go_const_block(group.title, rows)
        for e in group.entries:
            if e.values:
                rows = [(name_of(v), v.value, f'"{v.value}": {v.brief}') for v in e.values]
                out += _go_const_block(f"Values of {e.name}.", rows)
    if package == "semconv":
        out += [
            "",
            "// MetricSpec is a metric's instrument, unit and description, as the registry gives",
            "// them: instruments are created from these, never from literals of their own.",
            "type MetricSpec struct {",
            "\tInstrument, Unit, Description string",
            "}",
            "",
            "// Metrics holds every metric of the registry by name.",
            "var Metrics = map[string]MetricSpec{",
        ]
        for group in registry.groups:
            if group.kind != "metric":
                continue
            for e in group.entries:
                out.append(
                    f"\t{name_of(e)}: {{Instrument: {json.dumps(str(e.get('instrument')))}, "
                    f"Unit: {json.dumps(str(e.get('unit')))}, "
                    f"Description: {json.dumps(metric_description(e))}}},"
                )
        out.append("}")
    return gofmt("\n".join(out) + "\n")


def loadgen_name(item: Entry | Value) -> str:
    """The load generator's (package main) name: its `loadgen` override, else the Go name
    unexported (AttrNIC -> attrNIC)."""
    return item.loadgen or item.go[0].lower() + item.go[1:]


def gofmt(source: str) -> str:
    binary = shutil.which("gofmt")
    if binary is None:
        raise SystemExit("semconvgen: gofmt not found on PATH (it formats the Go output)")
    done = subprocess.run([binary], input=source, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"semconvgen: gofmt rejected the generated Go:\n{done.stderr}")
    return done.stdout


# --- docs -------------------------------------------------------------------------------------


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def doc_tables(registry: Registry, prom: ModuleType) -> dict[str, str]:
    attributes = registry.attributes()
    tables: dict[str, str] = {}
    for group in registry.groups:
        if group.kind == "attribute":
            with_on = any(e.get("on") for e in group.entries)
            header = ["key", "type", "on", "meaning"] if with_on else ["key", "type", "meaning"]
            rows = []
            for e in group.entries:
                row = [f"`{e.name}`", str(e.get("type"))]
                rows.append([*row, str(e.get("on")), e.brief] if with_on else [*row, e.brief])
            tables[group.id] = _table(header, rows)
        elif group.kind == "span":
            rows = []
            for e in group.entries:
                name, meaning = f"`{e.name}`", e.brief
                if e.get("name_values"):
                    attr = attributes[e.get("name_values")]
                    name = f"`{e.name}<{attr.name.rsplit('.', 1)[-1]}>`"
                    meaning += ": " + ", ".join(f"`{e.name}{v.value}`" for v in attr.values)
                rows.append([name, str(e.get("emitted_by")), str(e.get("parent")), meaning])
            tables[group.id] = _table(["span name", "emitted by", "parent", "meaning"], rows)
        elif group.kind == "metric":
            rows = []
            for e in group.entries:
                unit = str(e.get("unit"))
                promname = prom.prometheus_name(e.name, e.get("instrument"), unit)
                meaning = f"{e.brief} {e.get('note')}".strip()
                cells = [f"`{e.name}`", _instrument_label(e), unit, f"`{promname}`"]
                rows.append([*cells, _attribute_list(e), meaning])
            tables[group.id] = _table(
                ["metric", "type", "unit", "Prometheus", "attributes", "meaning"], rows
            )
        else:
            rows = []
            for e in group.entries:
                meaning = f"{e.brief} {e.get('note')}".strip()
                cells = [f"`{e.name}`", str(e.get("instrument")), f"`{e.get('unit')}`"]
                rows.append([*cells, ", ".join(e.get("attribute_cells")), meaning])
            tables[group.id] = _table(["metric", "type", "unit", "attributes", "meaning"], rows)
    value_rows = [
        [f"`{e.name}`", f"`{v.value}`", v.brief] for e in attributes.values() for v in e.values
    ]
    tables[VALUES_SECTION] = _table(["key", "value", "meaning"], value_rows)
    return tables


def render_doc(text: str, tables: dict[str, str], path: Path) -> str:
    """``text`` with each generated section replaced; every table must have its markers."""
    out, pos, found = [], 0, set()
    for match in BEGIN.finditer(text):
        section = match.group(1)
        if section not in tables:
            raise SystemExit(f"semconvgen: {path}: no registry group {section!r}")
        end = text.find(END, match.end())
        if end < 0:
            raise SystemExit(f"semconvgen: {path}: section {section!r} has no {END}")
        out += [text[pos : match.end()], "\n", tables[section], "\n"]
        pos = end
        found.add(section)
    missing = sorted(set(tables) - found)
    if missing:
        raise SystemExit(
            f"semconvgen: {path}: no <!-- BEGIN GENERATED: ... --> marker for {missing}"
        )
    out.append(text[pos:])
    return "".join(out)


# --- main -------------------------------------------------------------------------------------


def outputs(root: Path) -> dict[Path, str]:
    """Every generated file's path (relative to root) and the content it should have."""
    registry = load(root)
    prom = load_promnames(root)
    return {
        PYTHON_OUT: render_python(registry, prom),
        GO_OUT: render_go(registry, "semconv", lambda item: item.go),
        LOADGEN_OUT: render_go(registry, "main", loadgen_name),
        DOC: render_doc((root / DOC).read_text(), doc_tables(registry, prom), DOC),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root")
    args = parser.parse_args(argv)
    try:
        wanted = outputs(args.root)
    except RegistryError as err:
        print(f"semconvgen: {args.root / REGISTRY}: {err}", file=sys.stderr)
        return 2
    stale = []
    for rel, content in wanted.items():
        path = args.root / rel
        if path.exists() and path.read_text() == content:
            continue
        stale.append(rel)
        if not args.check:
            path.write_text(content)
            print(f"semconvgen: wrote {rel}")
    if args.check and stale:
        for rel in stale:
            print(f"semconvgen: {rel} is stale; run `make generate`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
