"""Snapshot tests of seeded screens (pytest-textual-snapshot). Regenerate after an intended
change with ``pytest tests/test_tui_snapshots.py --snapshot-update`` and review the SVGs."""

from __future__ import annotations

from typing import Any

from tui.app import MeshApp
from tui.fake import FakeSource


def test_fleet_wide_with_selection(snap_compare: Any) -> None:
    app = MeshApp(FakeSource(), live=False)
    assert snap_compare(app, terminal_size=(140, 40), press=["right", "down", "right", "enter"])


def test_fleet_80_columns(snap_compare: Any) -> None:
    app = MeshApp(FakeSource(), live=False)
    assert snap_compare(app, terminal_size=(80, 30), press=["down", "down", "enter"])


def test_filtered_outbound(snap_compare: Any) -> None:
    app = MeshApp(FakeSource(), live=False)
    assert snap_compare(app, terminal_size=(120, 36), press=["a", "slash", *"ecmp0", "enter"])


def test_workload_mode(snap_compare: Any) -> None:
    jobs = ({"name": "llama-70b", "nics": ["nic1", "nic2", "nic9", "nic20", "nic30"]},)
    app = MeshApp(FakeSource(jobs=jobs, control=True), live=False)
    assert snap_compare(app, terminal_size=(120, 36), press=["m"])


def test_control_confirmation_modal(snap_compare: Any) -> None:
    app = MeshApp(FakeSource(), live=False)
    assert snap_compare(app, terminal_size=(100, 30), press=["c"])


def test_large_fabric_1024(snap_compare: Any) -> None:
    from mesh.fabric import FabricShape, build_fabric

    fab = build_fabric(FabricShape.for_nics(1024, nics_per_leaf=32))
    app = MeshApp(FakeSource(fab), live=False)
    assert snap_compare(app, terminal_size=(160, 50))
