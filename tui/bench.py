"""Frame render benchmark of the mesh grid: everything one refresh costs the TUI.

A frame = choose visible NICs, compute every tile's look, lay the panels out, build every grid
line's strip (the whole grid, not only the visible part: an upper bound) and the header/events
text. The source's own work (`FakeSource.advance`) is not timed. The baseline is the same frame
for a small fabric, measured in the same run; the result quotes medians and their ratio.
"""

from __future__ import annotations

import statistics
import time

from rich.console import Console

from mesh.fabric import FabricShape, build_fabric
from tui.fake import FakeSource
from tui.grid import render_strips
from tui.layout import layout_grid
from tui.panes import events_text, header_text
from tui.view import ViewState, looks_for, visible_groups, visible_nics


def render_frame(source: FakeSource, view: ViewState, width: int, console: Console) -> int:
    """Render one full frame of ``source``'s current snapshot; return the number of strips."""
    snap = source.snapshot()
    shown, members = visible_nics(snap, view)
    looks = looks_for(snap, view, members)
    groups = visible_groups(snap.fabric, shown)
    digits = len(str(len(snap.nic_health) - 1))
    layout = layout_grid(groups, width, digits)
    strips = render_strips(layout, looks, digits, cursor=0)
    for text in (header_text(snap), events_text(snap, view.window_s)):
        list(console.render(text, console.options.update_width(width)))
    return len(strips)


def frame_times_ms(nics: int, frames: int, width: int, seed: int = 1) -> list[float]:
    """Return per-frame render times in ms for a fabric of ``nics`` NICs (32 per leaf)."""
    fabric = build_fabric(FabricShape.for_nics(nics, nics_per_leaf=min(32, nics)))
    source = FakeSource(fabric, seed=seed)
    console = Console(width=width, file=None, force_terminal=True, color_system="truecolor")
    view = ViewState()
    out = []
    for _ in range(frames + 2):
        source.advance(0.5)  # twice a second: new data each frame
        t0 = time.perf_counter()
        render_frame(source, view, width, console)
        out.append((time.perf_counter() - t0) * 1e3)
    return out[2:]  # first frames warm caches


def bench(
    nics: int, baseline_nics: int = 64, *, frames: int = 40, width: int = 160
) -> dict[str, object]:
    """Return median frame ms for ``nics`` and ``baseline_nics`` NICs, their ratio, the
    per-NIC cost ratio and whether the 50 ms frame budget is met."""
    big = statistics.median(frame_times_ms(nics, frames, width))
    small = statistics.median(frame_times_ms(baseline_nics, frames, width))
    return {
        "nics": nics,
        "frames": frames,
        "width": width,
        "median_frame_ms": round(big, 3),
        "baseline_nics": baseline_nics,
        "baseline_median_frame_ms": round(small, 3),
        "ratio_vs_baseline": round(big / small, 2) if small else None,
        "per_nic_cost_ratio": round((big / nics) / (small / baseline_nics), 3) if small else None,
        "budget_ms": 50.0,
        "within_budget": big <= 50.0,
    }
