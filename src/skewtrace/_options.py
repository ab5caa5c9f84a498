"""Settings declared once, on dataclass fields; their flags, variables and help are derived.

A field made with :func:`option` carries how text becomes its value (``parse``), which values
it accepts (``check``, applied by :func:`check_fields` from the dataclass's ``__post_init__``)
and the names it had before (``deprecated``). Its help is the docstring under the field, read
from the source the way Sphinx (and pydantic's ``use_attribute_docstrings``) read it, so each
setting is described once for readers of the code and for users of ``--help``.

Names and units. A field holding seconds ends in ``_s``; users give it in milliseconds under a
name ending in ``_millis`` (``window_s`` is ``--window-millis`` and
``SKEWTRACE_PACER_WINDOW_MILLIS``), as the OpenTelemetry SDK's settings do. Other fields are
exposed under their own name. A deprecated name still works, in the unit it always had
(seconds for the old ``_s`` names), and logs one warning naming its replacement.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import logging
import math
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

_log = logging.getLogger("skewtrace.config")
_METADATA_KEY = "skewtrace.option"


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message names the setting."""


class FieldError(ConfigError):
    """A field's value is not accepted; ``problem`` may name other fields as ``{0}``, ``{1}``."""

    def __init__(self, field_name: str, problem: str, *others: str) -> None:
        self.field = field_name
        self.problem = problem
        self.others = others
        super().__init__(f"{field_name} {self.detail()}")

    def detail(self, name: Callable[[str], str] = str) -> str:
        """The problem, with the other fields called what ``name`` calls them (flags, say)."""
        return self.problem.format(*(name(other) for other in self.others))


# ---------------------------------------------------------------- parsers: text -> value
# They raise ValueError with what was expected; the caller adds where the text came from.


def number(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError("expected a number") from None


def integer(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("expected an integer") from None


def text(raw: str) -> str:
    return raw.strip()


def word(raw: str) -> str:
    return raw.strip().lower()


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def boolean(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("expected true or false")


class HostPort(NamedTuple):
    """A listen address."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @classmethod
    def parse(cls, raw: str) -> HostPort:
        host, sep, port = raw.strip().rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit():
            raise ValueError("expected HOST:PORT, e.g. 127.0.0.1:4320")
        return cls(host, int(port))


# ---------------------------------------------------------------- checks: value -> problem
# None when the value is accepted, else what is wrong with it, phrased after the field's name.

Check = Callable[[Any], "str | None"]


def finite_number(value: Any) -> float | None:
    """A finite number (a JSON or config value) as a float, else None: a bool, a string, NaN,
    an infinity or an integer too large for a float is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _finite(value: Any) -> bool:
    return finite_number(value) is not None


def positive(value: Any) -> str | None:
    return None if _finite(value) and value > 0 else "must be a positive number"


def non_negative(value: Any) -> str | None:
    return None if _finite(value) and value >= 0 else "must be a number >= 0"


def fraction(value: Any) -> str | None:
    return None if _finite(value) and 0 < value <= 1 else "must be in (0, 1]"


def at_least(minimum: int) -> Check:
    def check(value: Any) -> str | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
        return None if ok else f"must be an integer >= {minimum}"

    return check


def one_of(*choices: str) -> Check:
    def check(value: Any) -> str | None:
        return None if value in choices else f"must be one of {', '.join(choices)}"

    return check


def not_blank(value: Any) -> str | None:
    return None if isinstance(value, str) and value.strip() else "must not be empty"


def http_url(value: Any) -> str | None:
    ok = isinstance(value, str) and value.startswith(("http://", "https://"))
    return None if ok else "expected http(s)://host:port"


def address(value: Any) -> str | None:
    if not isinstance(value, HostPort) or not value.host:
        return "expected HOST:PORT, e.g. 127.0.0.1:4320"
    return None if 0 <= value.port <= 65535 else "port must be in 0..65535"


# ---------------------------------------------------------------- declaring and reading


@dataclass(frozen=True)
class Option:
    parse: Callable[[str], Any]
    check: Check | None
    seconds: bool
    """The field holds seconds; users give milliseconds (under a ``_millis`` name)."""
    deprecated: tuple[str, ...]
    """Earlier names (in the exposed form, without prefix), whose values are in the field's
    own unit."""
    name: str | None = None
    """The exposed name when it is not derived from the field's (``policies`` is ``policy``)."""


def option(
    default: Any,
    *,
    parse: Callable[[str], Any] = number,
    check: Check | None = None,
    seconds: bool = False,
    deprecated: Iterable[str] = (),
    secret: bool = False,
    name: str | None = None,
) -> Any:
    """A dataclass field that is also a user-facing setting; see the module docstring.

    ``secret`` keeps the value out of ``repr`` (and so out of logs). ``name`` exposes the
    setting under another name than the field's (not for fields holding seconds).
    """
    if name is not None and seconds:
        raise TypeError("a setting holding seconds is named after its field (+ _millis)")
    meta = Option(parse, check, seconds, tuple(deprecated), name)
    return dataclasses.field(default=default, repr=not secret, metadata={_METADATA_KEY: meta})


def check_fields(instance: Any) -> None:
    """Raise :class:`FieldError` for the first field whose value its check rejects.

    ``None`` is not checked: on an optional field it means "not set".
    """
    for f in dataclasses.fields(instance):
        meta = f.metadata.get(_METADATA_KEY)
        value = getattr(instance, f.name)
        if meta is None or meta.check is None or value is None:
            continue
        problem = meta.check(value)
        if problem:
            raise FieldError(f.name, problem)


@dataclass(frozen=True)
class Setting:
    """One option field, as users see it."""

    field: str
    name: str
    """The exposed name, without prefix: ``window_millis`` for the field ``window_s``."""
    help: str
    default: Any
    option: Option

    def value(self, raw: str, *, deprecated: bool = False) -> Any:
        """The field's value for text given under the current name (or a deprecated one)."""
        value = self.option.parse(raw)
        if self.option.seconds and not deprecated:
            value = value / 1000.0
        return value

    def show(self, value: Any) -> str:
        """A field value as users would write it."""
        if value is None:
            return "none"
        if self.option.seconds:
            return f"{value * 1000:g}"
        return str(value)

    @property
    def unit_note(self) -> str:
        return " (milliseconds; the old name took seconds)" if self.option.seconds else ""


def settings(cls: type) -> list[Setting]:
    """The option fields of a dataclass, in declaration order."""
    docs = field_docs(cls)
    found = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(_METADATA_KEY)
        if meta is None:
            continue
        if meta.seconds and not f.name.endswith("_s"):
            raise TypeError(f"{cls.__name__}.{f.name} holds seconds: its name must end in _s")
        name = f.name[:-2] + "_millis" if meta.seconds else meta.name or f.name
        found.append(Setting(f.name, name, docs.get(f.name, ""), f.default, meta))
    return found


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a class, whitespace collapsed; {} without source."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    (node,) = ast.parse(source).body
    if not isinstance(node, ast.ClassDef):
        return {}
    docs = {}
    for statement, following in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


@dataclass(frozen=True)
class Given:
    """Text a user gave for a setting, and under which name."""

    raw: str
    source: str
    deprecated: bool = False


_warned: set[str] = set()


def warn_deprecated(old: str, new: str, note: str = "", *, ignored: bool = False) -> None:
    """One warning per process and old name."""
    if old in _warned:
        return
    _warned.add(old)
    if ignored:
        _log.warning("%s is deprecated and ignored: %s is set", old, new)
    else:
        _log.warning("%s is deprecated; use %s%s", old, new, note)


def from_env(setting: Setting, env: Mapping[str, str], prefix: str) -> Given | None:
    """The variable ``prefix + NAME`` (else a deprecated one) for a setting; blank is unset."""
    current = prefix + setting.name.upper()
    old_names = [prefix + old.upper() for old in setting.option.deprecated]
    if env.get(current, "").strip():
        for old in old_names:
            if env.get(old, "").strip():
                warn_deprecated(old, current, ignored=True)
        return Given(env[current], current)
    for old in old_names:
        if env.get(old, "").strip():
            warn_deprecated(old, current, setting.unit_note)
            return Given(env[old], old, deprecated=True)
    return None
