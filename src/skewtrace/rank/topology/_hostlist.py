"""Slurm hostlist expressions: ``node[01-04,07],gpu-a[1-3]-ib`` to a list of host names.

Follows what Slurm's ``hostlist_create`` accepts:

- hosts are separated by commas, spaces or tabs outside brackets;
- a bracket holds comma separated numbers and ``lo-hi`` ranges; a range is zero padded to
  the width of its lower bound as written (``[08-10]`` gives ``08 09 10``, ``[8-10]`` gives
  ``8 9 10``);
- one name may hold several bracket groups (``rack[1-2]-node[1-3]``); they expand as a
  cartesian product with the leftmost group varying slowest, as Slurm does;
- text may follow the last bracket (``gpu-a[1-3]-ib``).

Anything else (unbalanced or nested brackets, empty groups, ``hi < lo``, non-digits,
negative numbers, an expansion past :data:`MAX_HOSTS`) is a :class:`HostlistError` whose
message quotes the expression, so topology parsing can add the file and line.
"""

from __future__ import annotations

import itertools

__all__ = ["MAX_HOSTS", "HostlistError", "expand_hostlist"]

MAX_HOSTS = 1 << 20
"""Upper bound on the hosts one expression may expand to; guards memory against typos
such as ``node[0-99999999]``."""


class HostlistError(ValueError):
    """A hostlist expression Slurm would reject; the message quotes it."""


def _split_top_level(expression: str) -> list[str]:
    """Split on commas/whitespace that are outside brackets; check bracket balance."""
    tokens: list[str] = []
    current: list[str] = []
    depth = 0
    for char in expression:
        if char == "[":
            if depth:
                raise HostlistError(f"nested '[' in hostlist {expression!r}")
            depth = 1
        elif char == "]":
            if not depth:
                raise HostlistError(f"']' without '[' in hostlist {expression!r}")
            depth = 0
        elif depth == 0 and char in ", \t":
            if current:
                tokens.append("".join(current))
                current = []
            continue
        current.append(char)
    if depth:
        raise HostlistError(f"unclosed '[' in hostlist {expression!r}")
    if current:
        tokens.append("".join(current))
    return tokens


def _expand_group(group: str, expression: str) -> list[str]:
    """Numbers of one bracket group, formatted with the zero padding they were written in."""
    if not group.strip():
        raise HostlistError(f"empty brackets in hostlist {expression!r}")
    numbers: list[str] = []
    for raw_item in group.split(","):
        item = raw_item.strip()
        low_text, sep, high_text = item.partition("-")
        if not low_text.isdigit() or (sep and not high_text.isdigit()):
            raise HostlistError(f"bad range {item!r} in hostlist {expression!r}")
        low = int(low_text)
        high = int(high_text) if sep else low
        if high < low:
            raise HostlistError(f"range {item!r} runs backwards in hostlist {expression!r}")
        if high - low + 1 > MAX_HOSTS:
            raise HostlistError(
                f"range {item!r} has more than {MAX_HOSTS} hosts in hostlist {expression!r}"
            )
        width = len(low_text)
        numbers.extend(f"{n:0{width}d}" for n in range(low, high + 1))
    return numbers


def _expand_token(token: str, expression: str) -> list[str]:
    # Alternate literal text and bracket groups: "a[1-2]b[3]c" -> "a", [1,2], "b", [3], "c".
    parts: list[list[str]] = []
    rest = token
    while "[" in rest:
        literal, _, rest = rest.partition("[")
        group, _, rest = rest.partition("]")
        parts.append([literal])
        parts.append(_expand_group(group, expression))
    parts.append([rest])
    count = 1
    for part in parts:
        count *= len(part)
    if count > MAX_HOSTS:
        raise HostlistError(f"{token!r} expands to more than {MAX_HOSTS} hosts")
    return ["".join(combination) for combination in itertools.product(*parts)]


def expand_hostlist(expression: str) -> list[str]:
    """All host names of a Slurm hostlist expression, in the order Slurm lists them.

    Duplicates are kept (Slurm keeps them too); an empty or blank expression is an empty
    list.
    """
    hosts: list[str] = []
    for token in _split_top_level(expression):
        hosts.extend(_expand_token(token, expression))
        if len(hosts) > MAX_HOSTS:
            raise HostlistError(f"hostlist {expression!r} expands to more than {MAX_HOSTS} hosts")
    return hosts
