"""Query-string integers are ASCII digits only; a time range may be empty, never an error."""

from __future__ import annotations

import pytest

from controller.query import int_param, parse_int, time_range


@pytest.mark.parametrize(
    "raw",
    [
        "\u0663",
        "5_0",
        "+5",
        " 5 ",
        "5 ",
        "1_7",
        "0x10",
        "1e3",
        "",
        "-",
        "--1",
        "5.0",
        "\uff15",
        "1" * 20,
    ],
)
def test_only_ascii_digits_are_integers(raw: str) -> None:
    assert parse_int(raw) is None
    with pytest.raises(ValueError, match="ASCII digits"):
        int_param({"limit": raw}, "limit", 0, 10**30, ValueError)


def test_integers_in_range_and_out() -> None:
    assert parse_int("007") == 7 and parse_int("-3") == -3 and parse_int("9" * 19) == 10**19 - 1
    assert int_param({}, "limit", 1, 5, ValueError) is None
    assert int_param({"limit": "5"}, "limit", 1, 5, ValueError) == 5
    with pytest.raises(ValueError, match=r"in 1\.\.5, got 6"):
        int_param({"limit": "6"}, "limit", 1, 5, ValueError)


def test_time_range_is_two_bounded_integers() -> None:
    assert time_range({"since_ns": "9", "until_ns": "3"}, ValueError) == (9, 3)
    assert time_range({}, ValueError) == (None, None)
    with pytest.raises(ValueError):
        time_range({"until_ns": str(2**63)}, ValueError)
