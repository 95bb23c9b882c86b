"""The mesh grid widget: one boxed panel per ECMP group drawn through the Line API.

`MeshGrid` is a `ScrollView` whose `render_line` builds one `Strip` per screen line from the
layout (`tui.layout`) and the tile looks (`tui.render`); no widget per tile. Strips are cached
until the data, cursor or width changes. Keys: arrows/hjkl move the cursor, Enter selects;
a mouse click moves and selects. Selection is announced with `MeshGrid.Selected`.
`render_strips` is the pure per-frame work, shared with the benchmark.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tui.layout import GridLayout, layout_grid
from tui.render import TileLook

FRAME = Style(color="grey62")
CURSOR = Style(reverse=True, bold=True)
SELECTED = Style(underline=True, bold=True)


def line_strip(
    layout: GridLayout,
    y: int,
    looks: Sequence[TileLook],
    digits: int,
    cursor: int | None = None,
    selected: int | None = None,
) -> Strip:
    """Return the strip of grid line ``y``: frames, titles and tiles, gaps as spaces."""
    segs: list[Segment] = []
    x = 0
    for x0, what in layout.lines[y]:
        if x0 > x:
            segs.append(Segment(" " * (x0 - x)))
        if isinstance(what, str):
            segs.append(Segment(what, FRAME))
            x = x0 + len(what)
        else:
            look = looks[what]
            style = look.style
            if what == cursor:
                style = style + CURSOR
            elif what == selected:
                style = style + SELECTED
            segs.append(Segment(f"{what:>{digits}}{look.mark}", style))
            x = x0 + layout.tile_w
    return Strip(segs, x)


def render_strips(
    layout: GridLayout, looks: Sequence[TileLook], digits: int, cursor: int | None = None
) -> list[Strip]:
    """Return every line of the grid as strips (one full frame)."""
    return [line_strip(layout, y, looks, digits, cursor) for y in range(layout.height)]


class MeshGrid(ScrollView, can_focus=True):
    """Grid of NIC tiles grouped in ECMP-group panels.

    Feed it with `set_data(groups, looks, n_nics)`; it keeps the cursor on a visible NIC.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left,h", "move(-1, 0)", "left", show=False),
        Binding("right,l", "move(1, 0)", "right", show=False),
        Binding("up,k", "move(0, -1)", "up", show=False),
        Binding("down,j", "move(0, 1)", "down", show=False),
        Binding("enter", "select", "select NIC"),
    ]

    DEFAULT_CSS = """
    MeshGrid { background: $surface; }
    MeshGrid:focus { background-tint: $foreground 3%; }
    """

    class Selected(Message):
        """The operator selected NIC ``nic`` (index)."""

        def __init__(self, nic: int) -> None:
            self.nic = nic
            super().__init__()

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._groups: list[tuple[str, tuple[int, ...]]] = []
        self._looks: Sequence[TileLook] = ()
        self._digits = 1
        self.layout_: GridLayout = layout_grid([], 1, 1)
        self._cache: dict[int, Strip] = {}
        self.cursor: int | None = None
        self.selected: int | None = None

    def set_data(
        self, groups: list[tuple[str, tuple[int, ...]]], looks: Sequence[TileLook], n_nics: int
    ) -> None:
        """Show ``groups`` (name, visible NICs) with per-NIC ``looks``; redraw."""
        self._looks = looks
        self._digits = len(str(max(n_nics - 1, 0)))
        if groups != self._groups:
            self._groups = groups
            self._relayout()
        self._cache.clear()
        self.refresh()

    def _relayout(self) -> None:
        width = self.scrollable_content_region.width or self.size.width or 80
        self.layout_ = layout_grid(self._groups, width, self._digits)
        self.virtual_size = Size(self.layout_.width, self.layout_.height)
        if self.cursor not in self.layout_.pos:
            self.cursor = self.layout_.move(None, 0, 0)
        self._cache.clear()

    def on_resize(self, event: events.Resize) -> None:
        """Re-flow the panels for the new width."""
        self._relayout()
        self.refresh()

    def render_line(self, y: int) -> Strip:
        """Return screen line ``y`` (scrolled) of the grid."""
        scroll_x, scroll_y = self.scroll_offset
        gy = y + scroll_y
        width = self.scrollable_content_region.width
        if not 0 <= gy < self.layout_.height:
            return Strip.blank(width, self.rich_style)
        strip = self._cache.get(gy)
        if strip is None:
            strip = line_strip(
                self.layout_, gy, self._looks, self._digits, self.cursor, self.selected
            )
            self._cache[gy] = strip
        return strip.crop_extend(scroll_x, scroll_x + width, self.rich_style)

    def _cursor_changed(self) -> None:
        self._cache.clear()
        self.refresh()
        if self.cursor in self.layout_.pos:
            x, y = self.layout_.pos[self.cursor]
            self.scroll_to_region(Region(x, y, self.layout_.tile_w, 1), animate=False)

    def action_move(self, dx: int, dy: int) -> None:
        """Move the cursor one tile in a direction."""
        self.cursor = self.layout_.move(self.cursor, dx, dy)
        self._cursor_changed()

    def action_select(self) -> None:
        """Select the NIC under the cursor."""
        if self.cursor is not None:
            self.select(self.cursor)

    def select(self, nic: int) -> None:
        """Select ``nic`` (moving the cursor there) and post `Selected`."""
        self.selected = nic
        if nic in self.layout_.pos:
            self.cursor = nic
        self._cursor_changed()
        self.post_message(self.Selected(nic))

    def on_click(self, event: events.Click) -> None:
        """Select the tile under the mouse."""
        scroll_x, scroll_y = self.scroll_offset
        nic = self.layout_.hit(event.x + scroll_x, event.y + scroll_y)
        if nic is not None:
            self.focus()
            self.select(nic)
