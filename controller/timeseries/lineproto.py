"""InfluxDB line protocol: a frozen `Point` value and its serialization (pure).

`Point(measurement, tags, fields, t_ns)` validates on construction: names are non-empty,
field values are finite ints, floats or bools (no strings: VictoriaMetrics turns a string
field into a spurious metric of value 0, so the schema has none). `to_line_protocol(points)`
returns the request body (one line per point, nanosecond timestamps), with tag keys sorted
as InfluxDB recommends.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

FieldValue = int | float | bool


class PointError(ValueError):
    """A point is malformed (empty name, no fields, non-finite or unsupported value)."""


_TAG_ESC = str.maketrans({",": r"\,", "=": r"\=", " ": r"\ "})
_MEAS_ESC = str.maketrans({",": r"\,", " ": r"\ "})


@dataclass(frozen=True, slots=True)
class Point:
    """One line: ``measurement,tag=v,... field=v,... t_ns``."""

    measurement: str
    tags: Mapping[str, str]
    fields: Mapping[str, FieldValue]
    t_ns: int

    def __post_init__(self) -> None:
        if not self.measurement:
            raise PointError("point needs a measurement")
        if not self.fields:
            raise PointError(f"{self.measurement}: point needs at least one field")
        for k, v in self.tags.items():
            if not k or not isinstance(v, str) or not v:
                raise PointError(f"{self.measurement}: tag {k!r} needs a non-empty string")
            if "\n" in v or "\\" in v:
                raise PointError(f"{self.measurement}: tag {k!r} has a newline or backslash")
        for k, fv in self.fields.items():
            if not k:
                raise PointError(f"{self.measurement}: empty field name")
            if isinstance(fv, bool | int):
                continue
            if not isinstance(fv, float) or not math.isfinite(fv):
                raise PointError(f"{self.measurement}: field {k!r} = {fv!r} is not finite")
        if not isinstance(self.t_ns, int) or self.t_ns < 0:
            raise PointError(f"{self.measurement}: t_ns must be a non-negative int")

    def line(self) -> str:
        """Return the point as one line of line protocol (no newline)."""
        head = self.measurement.translate(_MEAS_ESC)
        tags = "".join(
            f",{k.translate(_TAG_ESC)}={self.tags[k].translate(_TAG_ESC)}"
            for k in sorted(self.tags)
        )
        fields = ",".join(f"{k.translate(_TAG_ESC)}={_field(v)}" for k, v in self.fields.items())
        return f"{head}{tags} {fields} {self.t_ns}"


def _field(v: FieldValue) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v}i"
    return repr(float(v))


def to_line_protocol(points: Iterable[Point]) -> bytes:
    """Return the request body for ``points`` (UTF-8, one line each, trailing newline)."""
    lines = [p.line() for p in points]
    return ("\n".join(lines) + "\n").encode() if lines else b""
