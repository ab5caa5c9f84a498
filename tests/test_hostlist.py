"""Slurm hostlist expansion: the forms ``hostlist_create``/``scontrol show hostnames``
accept, and the ones Slurm rejects."""

from __future__ import annotations

import pytest

from skewtrace.rank.topology._hostlist import MAX_HOSTS, HostlistError, expand_hostlist


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("node01", ["node01"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        # Padding follows the lower bound as written, as in Slurm.
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[001-3]", ["n001", "n002", "n003"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("n[5]", ["n5"]),
        ("n[5-5]", ["n5"]),
        # Text after the brackets.
        ("gpu-a[1-3]-ib", ["gpu-a1-ib", "gpu-a2-ib", "gpu-a3-ib"]),
        # A list of expressions, separated by commas, spaces or tabs outside brackets.
        (
            "node[01-02,07],gpu-a[1-2]-ib",
            ["node01", "node02", "node07", "gpu-a1-ib", "gpu-a2-ib"],
        ),
        ("a1 b[1-2]\tc", ["a1", "b1", "b2", "c"]),
        ("a1,,b1, ", ["a1", "b1"]),
        # Several bracket groups: leftmost varies slowest.
        (
            "rack[1-2]-node[01-02]",
            ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"],
        ),
        ("r[1,3]s[2]n[0-1].ib", ["r1s2n0.ib", "r1s2n1.ib", "r3s2n0.ib", "r3s2n1.ib"]),
        ("[1-2]", ["1", "2"]),
        ("node[ 1 - 2 ]", None),
        ("", []),
        ("   ", []),
        ("node[1,1]", ["node1", "node1"]),
    ],
)
def test_expand_hostlist(expression: str, expected: list[str] | None) -> None:
    if expected is None:
        with pytest.raises(HostlistError):
            expand_hostlist(expression)
    else:
        assert expand_hostlist(expression) == expected


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("node[1-3", "unclosed '['"),
        ("node1-3]", "']' without '['"),
        ("node[1-[2-3]]", "nested '['"),
        ("node[]", "empty brackets"),
        ("node[5-3]", "runs backwards"),
        ("node[a-c]", "bad range 'a-c'"),
        ("node[-1]", "bad range '-1'"),
        ("node[1-]", "bad range '1-'"),
        ("node[1--3]", "bad range '1--3'"),
        ("node[1,,2]", "bad range ''"),
        ("node[0x1-0x3]", "bad range"),
    ],
)
def test_malformed_hostlist_names_the_expression(expression: str, fragment: str) -> None:
    with pytest.raises(HostlistError) as info:
        expand_hostlist(expression)
    assert fragment in str(info.value)
    assert repr(expression) in str(info.value)


def test_expansion_is_bounded() -> None:
    with pytest.raises(HostlistError, match="more than"):
        expand_hostlist(f"n[0-{MAX_HOSTS}]")
    # The bound holds for products of groups that are each small enough.
    with pytest.raises(HostlistError, match="more than"):
        expand_hostlist("a[0-1023]b[0-1023]c[0-1]")


def test_large_valid_range() -> None:
    hosts = expand_hostlist("n[00000-09999]")
    assert len(hosts) == 10000
    assert hosts[0] == "n00000"
    assert hosts[-1] == "n09999"
