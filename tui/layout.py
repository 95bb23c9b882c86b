"""Grid layout math for the mesh grid: panels per ECMP group, tile positions, hit tests, moves.

`layout_grid` places one boxed panel per group (a near-square grid of NIC tiles) left to right,
wrapping at ``width``. The result knows, for every screen line, which text and which tiles are
on it (`GridLayout.lines`), where each NIC is (`pos`), which NIC is under a point (`hit`), and
where the cursor goes for an arrow key (`move`). Pure: no app, no styles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

# A line item: (x, text) for frame/title text or (x, nic_index) for a tile.
Item = tuple[int, str | int]


@dataclass(frozen=True, slots=True)
class Panel:
    """One group's box: top-left corner, size in characters, tile grid shape, member NICs."""

    group: str
    x: int
    y: int
    width: int
    height: int
    cols: int
    nics: tuple[int, ...]


@dataclass(frozen=True)
class GridLayout:
    """Placed panels plus per-line items; ``tile_w`` is the tile width without its gap."""

    width: int
    height: int
    tile_w: int
    panels: tuple[Panel, ...]
    lines: tuple[tuple[Item, ...], ...]
    pos: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def order(self) -> list[int]:
        """Visible NICs in reading order (top to bottom, left to right)."""
        return sorted(self.pos, key=lambda n: (self.pos[n][1], self.pos[n][0]))

    def hit(self, x: int, y: int) -> int | None:
        """Return the NIC whose tile covers (x, y) in grid coordinates, else None."""
        if not 0 <= y < len(self.lines):
            return None
        for x0, what in self.lines[y]:
            if isinstance(what, int) and x0 <= x < x0 + self.tile_w:
                return what
        return None

    def move(self, cur: int | None, dx: int, dy: int) -> int | None:
        """Return the NIC the cursor lands on moving (dx, dy) (each -1, 0 or 1) from ``cur``.

        Left/right step to the nearest tile on the same line, else the previous/next tile in
        reading order; up/down go to the nearest line above/below, nearest column first.
        Returns ``cur`` when there is nowhere to go, the first tile when ``cur`` is not shown.
        """
        if not self.pos:
            return None
        if cur not in self.pos:
            return self.order[0]
        cx, cy = self.pos[cur]
        if dy == 0:
            same = [
                (abs(x - cx), n) for n, (x, y) in self.pos.items() if y == cy and (x - cx) * dx > 0
            ]
            if same:
                return min(same)[1]
            order = self.order
            k = order.index(cur) + dx
            return order[k] if 0 <= k < len(order) else cur
        cand = [
            (abs(y - cy), abs(x - cx), n) for n, (x, y) in self.pos.items() if (y - cy) * dy > 0
        ]
        return min(cand)[2] if cand else cur


def panel_shape(n: int) -> tuple[int, int]:
    """Return (cols, rows) of the most square grid holding ``n`` tiles (cols >= rows)."""
    if n <= 0:
        return (0, 0)
    cols = math.ceil(math.sqrt(n))
    return cols, math.ceil(n / cols)


def layout_grid(groups: Sequence[tuple[str, Sequence[int]]], width: int, digits: int) -> GridLayout:
    """Lay out ``groups`` ((name, NIC indices) in display order; empty groups are skipped).

    Tiles are ``digits + 1`` characters (number + marker) followed by one space; panels are
    boxed (one character of frame each side) with the title in the top frame line, separated by
    one column and stacked in rows separated by nothing (the frames separate them).
    """
    tile_w = digits + 1
    step = tile_w + 1
    width = max(width, 1)
    panels: list[Panel] = []
    x = y = row_h = 0
    for name, members in groups:
        if not members:
            continue
        cols, rows = panel_shape(len(members))
        inner = max(cols * step + 1, len(name) + 2)
        pw, ph = inner + 2, rows + 2
        if x and x + pw > width:
            x, y, row_h = 0, y + row_h, 0
        panels.append(Panel(name, x, y, pw, ph, cols, tuple(members)))
        x += pw + 1
        row_h = max(row_h, ph)
    height = y + row_h
    lines: list[list[Item]] = [[] for _ in range(height)]
    pos: dict[int, tuple[int, int]] = {}
    for p in panels:
        title = f" {p.group} "[: p.width - 2]
        lines[p.y].append((p.x, "┌" + title + "─" * (p.width - 2 - len(title)) + "┐"))
        lines[p.y + p.height - 1].append((p.x, "└" + "─" * (p.width - 2) + "┘"))
        for r in range(p.height - 2):
            ly = p.y + 1 + r
            lines[ly].append((p.x, "│"))
            for c in range(p.cols):
                k = r * p.cols + c
                if k < len(p.nics):
                    tx = p.x + 2 + c * step
                    lines[ly].append((tx, p.nics[k]))
                    pos[p.nics[k]] = (tx, ly)
            lines[ly].append((p.x + p.width - 1, "│"))
    return GridLayout(
        width=max((p.x + p.width for p in panels), default=0),
        height=height,
        tile_w=tile_w,
        panels=tuple(panels),
        lines=tuple(tuple(sorted(li, key=lambda it: it[0])) for li in lines),
        pos=pos,
    )
