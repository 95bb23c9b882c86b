"""The live mesh screen: header, status, filter, legend, grid, NIC detail and events.

`MeshApp(source)` reads only the `SnapshotSource` interface, polling it every ``interval_s``
(an optional ``on_tick`` callback runs first: the demo advances its simulator there). Keys:
arrows/hjkl move, Enter/click select, ``/`` filter, ``m`` mode, ``a`` inbound/outbound alerts,
``w`` window, ``c`` Control (asks to confirm), ``q`` quit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar, Protocol, runtime_checkable

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.events import Resize
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Input, Label, Static

from mesh.snapshot import ControlUnavailable, MeshSnapshot, SnapshotSource
from tui.grid import MeshGrid
from tui.panes import (
    Connection,
    detail_text,
    events_text,
    header_text,
    legend_text,
    status_text,
)
from tui.render import DEFAULT_THRESHOLD_NS
from tui.view import WINDOWS, Alerts, Mode, ViewState, looks_for, visible_groups, visible_nics

NARROW_COLS = 120


@runtime_checkable
class RemoteSource(Protocol):
    """A source that reaches its controller over a connection (`tui.apiclient.ApiSource`):
    the screen shows ``connection()`` and tells it which NIC is selected (``focus``), whose
    delay row and column it then fetches."""

    def connection(self) -> Connection: ...
    def focus(self, nic: int | None) -> None: ...


class ConfirmControl(ModalScreen[bool]):
    """Ask to confirm turning Control on or off; dismisses with True (yes) or False."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "yes"),
        Binding("n,escape", "answer(False)", "no"),
    ]
    DEFAULT_CSS = """
    ConfirmControl { align: center middle; }
    ConfirmControl > Grid {
        grid-size: 2; grid-gutter: 1 2; grid-rows: auto 3; padding: 0 1;
        width: 60; height: auto; border: thick $warning; background: $surface;
    }
    ConfirmControl #question { column-span: 2; width: 1fr; content-align: center middle; }
    ConfirmControl Button { width: 100%; }
    """

    def __init__(self, enable: bool) -> None:
        super().__init__()
        self.enable = enable

    def compose(self) -> ComposeResult:
        """Build the question and the two buttons."""
        what = (
            "Enable Control? qpmesh will run remediations (drain NICs, restart ranks) itself."
            if self.enable
            else "Disable Control? Remediations will only be advised."
        )
        with Grid():
            yield Label(what, id="question")
            yield Button("Yes [y]", variant="warning", id="yes")
            yield Button("No [n]", variant="primary", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """Answer with the pressed button."""
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        """Answer from the keyboard."""
        self.dismiss(yes)


class MeshApp(App[None]):
    """Live view of a `SnapshotSource`."""

    TITLE = "qpmesh"
    CSS = """
    #header, #status, #legend { height: auto; padding: 0 1; }
    #header { background: $boost; }
    #filter { height: 1; border: none; padding: 0 1; margin: 0; }
    #main { height: 1fr; }
    #grid { width: 3fr; min-width: 40; }
    #side { width: 2fr; min-width: 40; }
    #detail-box { height: 1fr; border-top: solid $primary; }
    #events-box { height: 1fr; border-top: solid $primary; }
    #main.narrow { layout: vertical; }
    #main.narrow #grid { width: 1fr; height: 1fr; min-width: 0; }
    #main.narrow #side { width: 1fr; height: 1fr; min-width: 0; layout: horizontal; }
    #main.narrow #detail-box, #main.narrow #events-box { width: 1fr; height: 1fr; padding: 0 1 0 0; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"),
        Binding("slash", "filter", "filter"),
        Binding("escape", "grid", "grid", show=False),
        Binding("m", "mode", "mode"),
        Binding("a", "alerts", "in/out"),
        Binding("w", "window", "window"),
        Binding("c", "control", "Control"),
    ]

    def __init__(
        self,
        source: SnapshotSource,
        *,
        interval_s: float = 0.5,
        threshold_ns: float = DEFAULT_THRESHOLD_NS,
        on_tick: Callable[[], None] | None = None,
        live: bool = True,
    ) -> None:
        super().__init__()
        self.source = source
        self.interval_s = interval_s
        self.on_tick = on_tick
        self.live = live
        self.view = ViewState(threshold_ns=threshold_ns)
        self.snap: MeshSnapshot = source.snapshot()
        self.selected: int | None = None
        self.note = ""  # the last refusal (e.g. of Control), shown in the status line
        self._mounted = False

    def compose(self) -> ComposeResult:
        """Build the screen."""
        yield Static(id="header")
        yield Static(id="status")
        yield Input(placeholder="/ filter: NIC, host, address, group (ecmp1), glob *", id="filter")
        yield Static(id="legend")
        with Horizontal(id="main"):
            yield MeshGrid(id="grid")
            with VerticalScroll(id="side"):
                with VerticalScroll(id="detail-box"):
                    yield Static(id="detail")
                with VerticalScroll(id="events-box"):
                    yield Static(id="events")
        yield Footer()

    def on_mount(self) -> None:
        """Draw the first frame, focus the grid and start polling the source."""
        self._w = {w.id: w for w in self.query("#header, #status, #legend, #detail, #events")}
        self._grid = self.query_one(MeshGrid)
        self._detail_box = self.query_one("#detail-box")
        self._detail_box.border_title = "NIC"
        self.query_one("#events-box").border_title = "Events"
        self._main = self.query_one("#main")
        self._main.set_class(self.size.width < NARROW_COLS, "narrow")
        self._mounted = True
        self.redraw()
        self._grid.focus()
        if self.live:
            self.set_interval(self.interval_s, self.poll)

    def poll(self) -> None:
        """Advance (demo hook), read the latest snapshot and redraw."""
        if self.on_tick is not None:
            self.on_tick()
        if not self._mounted:
            return
        self.snap = self.source.snapshot()
        self.redraw()

    # ---- drawing ------------------------------------------------------------------------
    def redraw(self) -> None:
        """Redraw every pane from ``self.snap`` and ``self.view``."""
        snap, view = self.snap, self.view
        shown, members = visible_nics(snap, view)
        grid = self._grid
        grid.set_data(
            visible_groups(snap.fabric, shown), looks_for(snap, view, members), len(snap.nic_health)
        )
        self._static("header").update(header_text(snap))
        conn = self.source.connection() if isinstance(self.source, RemoteSource) else None
        self._static("status").update(
            status_text(snap, view, conn=conn, now_s=time.monotonic(), note=self.note)
        )
        self._static("legend").update(legend_text(view.threshold_ns))
        self._draw_detail()
        self._static("events").update(events_text(snap, view.window_s))

    def _draw_detail(self) -> None:
        nic = self.selected
        hist = self.source.history(nic, self.view.window_s) if nic is not None else None
        width = self._detail_box.size.width or 40
        text = detail_text(self.snap, nic, hist, self.view, width - 2)
        self._static("detail").update(text)
        self._detail_box.border_title = self.snap.fabric.nics[nic].id if nic is not None else "NIC"

    def _static(self, wid: str) -> Static:
        w = self._w[wid]
        assert isinstance(w, Static)
        return w

    def on_resize(self, event: Resize) -> None:
        """Stack grid over detail/events below `NARROW_COLS` columns."""
        if self._mounted:
            self._main.set_class(event.size.width < NARROW_COLS, "narrow")

    # ---- events and actions ---------------------------------------------------------------
    @on(MeshGrid.Selected)
    def _selected(self, message: MeshGrid.Selected) -> None:
        self.selected = message.nic
        if isinstance(self.source, RemoteSource):
            self.source.focus(message.nic)
        self._draw_detail()

    @on(Input.Changed, "#filter")
    def _filter(self, message: Input.Changed) -> None:
        self.view = _replace(self.view, query=message.value)
        self.redraw()

    @on(Input.Submitted, "#filter")
    def _filter_done(self, message: Input.Submitted) -> None:
        self._grid.focus()

    def action_filter(self) -> None:
        """Focus the filter box."""
        self.set_focus(self.query_one("#filter", Input))  # now, not later: typing follows at once

    def action_grid(self) -> None:
        """Return focus to the grid."""
        self._grid.focus()

    def action_mode(self) -> None:
        """Cycle Fleet -> Workload(job 0) -> ... -> Fleet; say so when jobs are unavailable."""
        jobs = self.snap.jobs
        if not jobs:
            self.notify(
                "Workload mode unavailable: no job information from this controller"
                if jobs is None
                else "Workload mode: no running jobs",
                severity="warning",
            )
            self.view = _replace(self.view, mode=Mode.FLEET)
        elif self.view.mode == Mode.FLEET:
            self.view = _replace(self.view, mode=Mode.WORKLOAD, job=0)
        elif self.view.job + 1 < len(jobs):
            self.view = _replace(self.view, job=self.view.job + 1)
        else:
            self.view = _replace(self.view, mode=Mode.FLEET, job=0)
        self.redraw()

    def action_alerts(self) -> None:
        """Toggle colouring NICs by inbound or outbound delays."""
        nxt = Alerts.OUTBOUND if self.view.alerts == Alerts.INBOUND else Alerts.INBOUND
        self.view = _replace(self.view, alerts=nxt)
        self.redraw()

    def action_window(self) -> None:
        """Cycle the time window (2 min, 15 min, 1 h)."""
        self.view = _replace(self.view, window=(self.view.window + 1) % len(WINDOWS))
        self.redraw()

    def action_control(self) -> None:
        """Ask to confirm, then turn Control on/off; report when the source has no Control."""
        enable = not bool(self.snap.control_enabled)

        def answered(yes: bool | None) -> None:
            if not yes:
                self.notify("Control unchanged")
                return
            try:
                self.source.set_control(enable)
            except ControlUnavailable as exc:
                self.note = f"Control refused: {exc}"
                self.notify(f"Control unavailable: {exc}", severity="error")
                self.redraw()
                return
            self.note = ""
            self.snap = self.source.snapshot()
            self.redraw()
            self.notify(f"Control {'enabled' if enable else 'disabled'}")

        self.push_screen(ConfirmControl(enable), answered)


def _replace(view: ViewState, **changes: object) -> ViewState:
    from dataclasses import replace

    return replace(view, **changes)  # type: ignore[arg-type]
