"""Pure renderables of the mesh screen: tiles, layout, navigation, heatmap, sparkline, panes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from contract.documents import EventDoc
from mesh.fabric import FabricShape, build_fabric
from mesh.snapshot import Health
from tui.fake import FakeSource
from tui.layout import layout_grid, panel_shape
from tui.panes import detail_text, event_line, header_text, pair_vectors, path_breakdown
from tui.render import (
    bin_max,
    fmt_bps,
    fmt_ns,
    heat_level,
    heat_row,
    sparkline,
    tile_look,
    tile_looks,
)
from tui.view import Alerts, Mode, ViewState, match_nics, visible_groups, visible_nics


@pytest.mark.parametrize(
    ("health", "mark"),
    [(Health.DOWN, "x"), (Health.FLAPPING, "~"), (Health.CONTENDED, "!"), (Health.UNKNOWN, "?")],
)
def test_unhealthy_tiles_have_a_text_marker(health: Health, mark: str) -> None:
    assert tile_look(health, 1.0, 5000.0).mark == mark


def test_slow_up_tile_is_marked_and_coloured_differently() -> None:
    ok = tile_look(Health.UP, 4_999.0, 5_000.0)
    slow = tile_look(Health.UP, 5_001.0, 5_000.0)
    assert ok.mark == " " and slow.mark == "^"
    assert ok.style.bgcolor != slow.style.bgcolor
    assert tile_look(Health.UP, float("nan"), 5_000.0).mark == " "
    assert tile_look(Health.DOWN, 50_000.0, 5_000.0).mark == "x"  # health wins over delay
    assert tile_look(Health.UP, 0.0, 5_000.0, job_member=True).mark == "*"


def test_tile_looks_matches_scalar_form() -> None:
    health = [Health.UP, Health.UP, Health.DOWN, Health.UP]
    delay = np.array([1.0, 9_000.0, 1.0, np.nan])
    looks = tile_looks(health, delay, 5_000.0, frozenset({3}))
    for i, look in enumerate(looks):
        assert look == tile_look(health[i], float(delay[i]), 5_000.0, job_member=i == 3)


def test_formats() -> None:
    assert fmt_ns(float("nan")) == "n/a" and fmt_ns(None) == "n/a"
    assert fmt_ns(512.0) == "512 ns"
    assert fmt_ns(5_000.0) == "5.00 µs"
    assert fmt_ns(2.5e6) == "2.50 ms"
    assert fmt_bps(None) == "n/a" and fmt_bps(400e9) == "400.0 Gb/s"


def test_panel_shape_is_square_enough() -> None:
    assert panel_shape(0) == (0, 0)
    assert panel_shape(8) == (3, 3)
    assert panel_shape(9) == (3, 3)
    assert panel_shape(32) == (6, 6)
    for n in range(1, 300):
        c, r = panel_shape(n)
        assert c * r >= n and c - r <= 1 and c * (r - 1) < n


def test_layout_places_every_nic_once_within_width() -> None:
    groups = [(f"ecmp{g}", tuple(range(g * 32, g * 32 + 32))) for g in range(8)]
    lay = layout_grid(groups, 80, 3)
    assert sorted(lay.pos) == list(range(256))
    assert len(set(lay.pos.values())) == 256
    assert lay.width <= 80
    for n, (x, y) in lay.pos.items():
        assert lay.hit(x, y) == n and lay.hit(x + lay.tile_w - 1, y) == n
    assert lay.hit(0, 0) is None  # a frame corner
    assert layout_grid([("g", ())], 80, 1).pos == {}


def test_layout_narrow_width_stacks_panels() -> None:
    groups = [(f"ecmp{g}", tuple(range(g * 8, g * 8 + 8))) for g in range(4)]
    wide = layout_grid(groups, 200, 2)
    narrow = layout_grid(groups, 20, 2)
    assert len({p.y for p in wide.panels}) == 1
    assert len({p.y for p in narrow.panels}) == 4


def test_move_follows_arrows_across_panels() -> None:
    groups = [("a", (0, 1, 2, 3)), ("b", (4, 5, 6, 7))]  # two 2x2 panels side by side
    lay = layout_grid(groups, 80, 1)
    assert lay.move(None, 1, 0) == 0
    assert lay.move(0, 1, 0) == 1
    assert lay.move(1, 1, 0) == 4  # into the next panel on the same line
    assert lay.move(0, 0, 1) == 2
    assert lay.move(2, 0, -1) == 0
    assert lay.move(0, 0, -1) == 0  # nowhere to go
    assert lay.move(0, -1, 0) == 0
    assert lay.move(5, 0, 1) == 7


def test_heat_and_sparkline() -> None:
    assert [heat_level(v, 1000.0) for v in (100.0, 800.0, 1500.0, 5000.0)] == [0, 1, 2, 3]
    assert heat_level(float("nan"), 1.0) == -1
    row = heat_row(np.array([100.0, np.nan, 5000.0]), 10, 1000.0)
    assert row.plain == "░·█"
    binned = bin_max(np.arange(100, dtype=float), 10)
    assert len(binned) == 10 and binned[-1] == 99.0
    sp = sparkline(np.array([0.0, 5.0, 10.0]), 3, threshold_ns=7.0)
    assert sp.plain == "▁▅█"
    assert [s.style.color.name for s in sp.spans] == ["green", "green", "red"]  # type: ignore[union-attr]
    assert sparkline(np.array([np.nan]), 5).plain == ""


def test_filter_matches_exact_ids_then_substrings_and_globs() -> None:
    fab = build_fabric(FabricShape(leaves=2, hosts_per_leaf=12))
    assert match_nics(fab, "") is None
    assert match_nics(fab, "nic1") == {1}  # exact id, not nic10, nic11
    assert match_nics(fab, "ecmp1") == set(range(12, 24))
    assert match_nics(fab, "10.0.0.3") == {2}
    assert match_nics(fab, "nic1*") == {1, *range(10, 20)}
    assert match_nics(fab, "ecmp1 nic2*") == set(range(20, 24))
    assert match_nics(fab, "nosuch") == set()
    groups = visible_groups(fab, {1, 13})
    assert groups == [("ecmp0", (1,)), ("ecmp1", (13,))]


def test_workload_mode_shows_only_job_nics() -> None:
    src = FakeSource(jobs=({"name": "llm", "nics": ["nic1", "nic2", "nic9"]},))
    snap = src.snapshot()
    shown, members = visible_nics(snap, ViewState(mode=Mode.WORKLOAD))
    assert shown == {1, 2, 9} and members == frozenset({1, 2, 9})
    shown, members = visible_nics(snap, ViewState())
    assert shown is None and not members


def test_pair_vectors_and_paths_from_snapshot() -> None:
    snap = FakeSource().snapshot()
    row, _ = pair_vectors(snap, 0)
    k = np.flatnonzero(snap.owd_src == 0)
    assert np.allclose(row[snap.owd_dst[k]], snap.owd_ns[k], equal_nan=True)
    assert np.isnan(row[0])
    paths = path_breakdown(snap, 17)  # the contended NIC: spine1 is slow
    assert set(paths) == {"spine0", "spine1", "spine2", "spine3"}
    assert paths["spine1"][0] > 1.5 * paths["spine0"][0]


def test_panes_say_unavailable_and_control_verdict() -> None:
    snap = FakeSource(control=None).snapshot()
    head = header_text(snap).plain
    assert "Healthy NICs 29/32 · 0 unknown · 3 unhealthy" in head
    assert "Control unavailable" in head and "Running jobs unavailable" in head
    ev = EventDoc(snap.t_ns, "remediation", "nic3", "drain")
    assert "advice only" in event_line(ev, snap).plain
    on = FakeSource(control=True).snapshot()
    assert "Control ran it" in event_line(ev, on).plain
    flap = next(e for e in snap.events if e.kind == "link_flap")
    assert "flaps=4" in event_line(flap, snap).plain


def test_detail_text_shows_clock_gpu_and_history() -> None:
    src = FakeSource()
    snap = src.snapshot()
    view = ViewState(alerts=Alerts.OUTBOUND)
    text = detail_text(snap, 17, src.history(17, 120.0), view, 60).plain
    assert "nic17" in text and "contended" in text
    assert "clock offset" in text and "± 12 ns" in text
    assert "FAULT Xid 79" in text
    assert "spine1" in text and "worst delay, last 2m" in text
    assert "No NIC selected" in detail_text(snap, None, None, view, 60).plain
    unc = snap.clock_uncertainty_ns.copy()
    unc[17] = np.inf  # the controller has not confirmed this clock yet
    text = detail_text(dataclasses.replace(snap, clock_uncertainty_ns=unc), 17, None, view, 60)
    assert "not yet confirmed" in text.plain and "inf" not in text.plain


def test_unknown_has_its_own_glyph_colour_and_count() -> None:
    import dataclasses

    from mesh.snapshot import Health

    snap = FakeSource().snapshot()
    health = list(snap.nic_health)
    health[:5] = [Health.UNKNOWN] * 5
    snap = dataclasses.replace(snap, nic_health=tuple(health))
    head = header_text(snap).plain
    assert f"Healthy NICs {snap.healthy_count}/32 · 5 unknown · " in head
    unknown, up = tile_look(Health.UNKNOWN, 0.0, 5e3), tile_look(Health.UP, 0.0, 5e3)
    assert unknown.mark == "?" and unknown.style.bgcolor != up.style.bgcolor
    assert len({tile_look(h, 0.0, 5e3).style.bgcolor for h in Health}) == len(Health)
