"""The mesh app driven with the Pilot on seeded fake sources: navigation, selection, filter,
mode and alerts switches, Control confirmation."""

from __future__ import annotations

from textual.widgets import Input, Static

from tui.app import ConfirmControl, MeshApp
from tui.fake import FakeSource
from tui.grid import MeshGrid
from tui.view import Alerts, Mode

SIZE = (120, 40)


def _text(app: MeshApp, wid: str) -> str:
    return str(app.query_one(wid, Static).render())


async def test_arrows_move_cursor_and_enter_selects() -> None:
    app = MeshApp(FakeSource(), live=False)
    async with app.run_test(size=SIZE) as pilot:
        grid = app.query_one(MeshGrid)
        assert grid.cursor == 0
        await pilot.press("right", "right", "down")
        assert grid.cursor == 5
        await pilot.press("l")  # 6-wide row? ecmp0 is 3x3: right of 5 is the next panel
        assert grid.cursor == 11
        await pilot.press("h", "k")
        assert grid.cursor == 2
        assert app.selected is None
        await pilot.press("enter")
        await pilot.pause()
        assert app.selected == 2
        assert "nic2" in _text(app, "#detail")
        assert "clock offset" in _text(app, "#detail")


async def test_click_selects_tile() -> None:
    app = MeshApp(FakeSource(), live=False)
    async with app.run_test(size=SIZE) as pilot:
        grid = app.query_one(MeshGrid)
        x, y = grid.layout_.pos[17]
        await pilot.click(MeshGrid, offset=(x, y))
        await pilot.pause()
        assert app.selected == 17 and grid.cursor == 17
        assert "contended" in _text(app, "#detail")


async def test_filter_limits_grid_to_matching_nics() -> None:
    app = MeshApp(FakeSource(), live=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("slash")
        assert isinstance(app.focused, Input)
        await pilot.press(*"ecmp2")
        await pilot.press("enter")
        grid = app.query_one(MeshGrid)
        assert sorted(grid.layout_.pos) == list(range(16, 24))
        assert [p.group for p in grid.layout_.panels] == ["ecmp2"]
        assert app.focused is grid
        assert grid.cursor == 16  # cursor moved onto a visible NIC
        app.query_one(Input).value = ""
        await pilot.pause()
        assert len(grid.layout_.pos) == 32


async def test_mode_is_unavailable_without_jobs_and_workload_with_jobs() -> None:
    app = MeshApp(FakeSource(), live=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("m")
        await pilot.pause()
        assert app.view.mode == Mode.FLEET
        assert "Workload unavailable" in _text(app, "#status")
        assert any("unavailable" in n.message for n in app._notifications)
    jobs = ({"name": "llama", "nics": ["nic1", "nic9", "nic20"]},)
    app = MeshApp(FakeSource(jobs=jobs), live=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("m")
        await pilot.pause()
        assert app.view.mode == Mode.WORKLOAD
        assert "Workload: llama" in _text(app, "#status")
        assert "Running jobs 1" in _text(app, "#header")
        assert sorted(app.query_one(MeshGrid).layout_.pos) == [1, 9, 20]
        await pilot.press("m")
        assert app.view.mode == Mode.FLEET
    cause = "step time 1.6x; pcie at nic9: pcie_replay_timeout 900/s"
    app = MeshApp(FakeSource(jobs=({**jobs[0], "cause": cause},)), live=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("m")
        await pilot.pause()
        assert f"cause {cause}" in _text(app, "#status")  # the slow job's root cause


async def test_alerts_toggle_recolours_by_direction() -> None:
    app = MeshApp(FakeSource(), live=False)
    async with app.run_test(size=SIZE) as pilot:
        grid = app.query_one(MeshGrid)
        assert grid._looks[5].mark == "^"  # NIC 5 is slow inbound only
        await pilot.press("a")
        assert app.view.alerts == Alerts.OUTBOUND
        assert grid._looks[5].mark == " "
        assert "Outbound" in _text(app, "#status")


async def test_window_cycles() -> None:
    app = MeshApp(FakeSource(), live=False)
    async with app.run_test(size=SIZE) as pilot:
        labels = []
        for _ in range(3):
            await pilot.press("w")
            labels.append(app.view.window_label)
        assert labels == ["15m", "1h", "2m"]


async def test_control_asks_confirmation_then_enables() -> None:
    src = FakeSource(control=False)
    app = MeshApp(src, live=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("c")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmControl) and app.screen.enable
        await pilot.press("n")
        await pilot.pause()
        assert src.control is False
        await pilot.press("c")
        await pilot.pause()
        await pilot.click("#yes")
        await pilot.pause()
        assert src.control is True
        assert "Control Enabled" in _text(app, "#header")


async def test_control_unavailable_is_reported() -> None:
    app = MeshApp(FakeSource(control=None), live=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("c", "y")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmControl)
        assert any("Control unavailable" in n.message for n in app._notifications)
        assert "Control unavailable" in _text(app, "#header")


async def test_live_polling_advances_source() -> None:
    src = FakeSource()
    t0 = src.snapshot().t_ns
    app = MeshApp(src, interval_s=0.01, on_tick=lambda: src.advance(0.5))
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(20):
            await pilot.pause(0.02)
            if app.snap.t_ns > t0:
                break
        assert app.snap.t_ns > t0
