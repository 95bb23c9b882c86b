"""Pure renderables for the mesh screen: tile look, number formats, heatmap cells, sparklines.

Nothing here touches an app, a clock or a source: functions take values (a snapshot's arrays,
a threshold) and return characters and Rich styles, so they are unit-tested directly.
Every colour has a text fallback: unhealthy tiles carry a marker character
(``x`` down, ``~`` flapping, ``!`` contended, ``-`` degraded, ``?`` unknown, ``^`` delay over
threshold, ``*`` job member) and heat cells use shade blocks whose density follows the delay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from rich.style import Style
from rich.text import Text

from mesh.snapshot import Health

DEFAULT_THRESHOLD_NS = 5_000.0

MARKERS: dict[Health, str] = {
    Health.UP: " ",
    Health.DEGRADED: "-",
    Health.CONTENDED: "!",
    Health.FLAPPING: "~",
    Health.DOWN: "x",
    Health.UNKNOWN: "?",
}
SLOW_MARK = "^"
JOB_MARK = "*"

HEALTH_BG: dict[Health, str] = {  # a tile's colour by state (unknown: grey, never green)
    Health.UP: "green",
    Health.DEGRADED: "dark_orange",
    Health.CONTENDED: "orange1",
    Health.FLAPPING: "magenta",
    Health.DOWN: "red",
    Health.UNKNOWN: "grey35",
}
SLOW_BG = "yellow"


@dataclass(frozen=True, slots=True)
class TileLook:
    """How one NIC tile is drawn: a marker character and a Rich style."""

    mark: str
    style: Style


def tile_look(
    health: Health, delay_ns: float, threshold_ns: float, *, job_member: bool = False
) -> TileLook:
    """Return the marker and style of a tile from NIC health and its worst delay (ns, NaN = none).

    Health wins over delay: an UP NIC whose delay exceeds ``threshold_ns`` is yellow with ``^``.
    """
    mark = MARKERS[health]
    bg = HEALTH_BG[health]
    if health == Health.UP and not math.isnan(delay_ns) and delay_ns > threshold_ns:
        mark, bg = SLOW_MARK, SLOW_BG
    if job_member and mark == " ":
        mark = JOB_MARK
    fg = "white" if health in (Health.DOWN, Health.FLAPPING, Health.UNKNOWN) else "black"
    return TileLook(mark, Style(color=fg, bgcolor=bg, bold=job_member, underline=job_member))


def tile_looks(
    health: Sequence[Health],
    delay_ns: npt.NDArray[np.float64],
    threshold_ns: float,
    jobs: frozenset[int] = frozenset(),
) -> list[TileLook]:
    """Return one `TileLook` per NIC index (vector form of `tile_look`, with look caching)."""
    cache: dict[tuple[Health, bool, bool], TileLook] = {}
    out: list[TileLook] = []
    slow = np.nan_to_num(delay_ns, nan=-1.0) > threshold_ns
    for i, h in enumerate(health):
        key = (h, bool(slow[i]), i in jobs)
        look = cache.get(key)
        if look is None:
            look = tile_look(h, float(delay_ns[i]), threshold_ns, job_member=key[2])
            cache[key] = look
        out.append(look)
    return out


def fmt_ns(v: float | None) -> str:
    """Return a delay or offset in ns as a short human string (ns, µs, ms), or ``n/a``."""
    if v is None or math.isnan(v):
        return "n/a"
    a = abs(v)
    if a < 1_000:
        return f"{v:.0f} ns"
    if a < 1_000_000:
        return f"{v / 1e3:.2f} µs"
    return f"{v / 1e6:.2f} ms"


def fmt_bps(v: float | None) -> str:
    """Return a throughput in bits/s as Gb/s or Tb/s, or ``n/a`` when None/NaN."""
    if v is None or math.isnan(v):
        return "n/a"
    if v >= 1e12:
        return f"{v / 1e12:.2f} Tb/s"
    return f"{v / 1e9:.1f} Gb/s"


HEAT_CHARS = ("░", "▒", "▓", "█")
HEAT_STYLES = (
    Style(color="green"),
    Style(color="green3"),
    Style(color="yellow"),
    Style(color="red"),
)
NO_DATA = ("·", Style(color="grey50"))


def heat_level(v: float, threshold_ns: float) -> int:
    """Return 0..3: <= T/2, <= T, <= 2T, > 2T (T = threshold); -1 for NaN."""
    if math.isnan(v):
        return -1
    if v <= threshold_ns / 2:
        return 0
    if v <= threshold_ns:
        return 1
    if v <= 2 * threshold_ns:
        return 2
    return 3


def bin_max(values: npt.NDArray[np.float64], width: int) -> npt.NDArray[np.float64]:
    """Return ``values`` reduced to at most ``width`` bins, each the max (NaN if all NaN)."""
    n = len(values)
    if width <= 0 or n == 0:
        return np.zeros(0)
    if n <= width:
        return values.astype(np.float64)
    edges = np.linspace(0, n, width + 1).astype(int)
    out = np.full(width, np.nan)
    for b in range(width):
        chunk = values[edges[b] : edges[b + 1]]
        if len(chunk) and not np.all(np.isnan(chunk)):
            out[b] = np.nanmax(chunk)
    return out


def heat_row(values: npt.NDArray[np.float64], width: int, threshold_ns: float) -> Text:
    """Return a heatmap row: one shaded, coloured cell per value (binned to ``width`` by max)."""
    text = Text()
    for v in bin_max(values, width):
        lvl = heat_level(float(v), threshold_ns)
        if lvl < 0:
            text.append(*NO_DATA)
        else:
            text.append(HEAT_CHARS[lvl], HEAT_STYLES[lvl])
    return text


SPARK_CHARS = "▁▂▃▄▅▆▇█"


def sparkline(
    values: npt.NDArray[np.float64], width: int, threshold_ns: float | None = None
) -> Text:
    """Return a sparkline of ``values`` binned to ``width`` cells (max per bin).

    Scale is 0..max(values, threshold); cells above ``threshold_ns`` are red, others green;
    NaN bins are blank. Empty input gives an empty Text.
    """
    binned = bin_max(np.asarray(values, dtype=np.float64), width)
    text = Text()
    if not len(binned) or np.all(np.isnan(binned)):
        return text
    top = float(np.nanmax(binned))
    if threshold_ns is not None:
        top = max(top, threshold_ns)
    top = top or 1.0
    for v in binned:
        if math.isnan(v):
            text.append(" ")
            continue
        k = min(len(SPARK_CHARS) - 1, max(0, int(v / top * (len(SPARK_CHARS) - 1) + 0.5)))
        over = threshold_ns is not None and v > threshold_ns
        text.append(SPARK_CHARS[k], Style(color="red" if over else "green"))
    return text
