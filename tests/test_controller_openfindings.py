"""A restarted controller keeps what its predecessor had open (`controller.openfindings`,
issue 32): neither raised twice nor open for good. Time passed in."""

from __future__ import annotations

from pathlib import Path

from contract.documents import EventDoc
from controller.openfindings import FILE, OpenFindings, load, save

S = 1_000_000_000


def _kinds(events: list[EventDoc]) -> list[tuple[str, str]]:
    return [(e.kind, e.target) for e in events]


def test_a_restart_neither_raises_again_nor_forgets(tmp_path: Path) -> None:
    before = OpenFindings()
    before.apply([EventDoc(1 * S, "contention", "leaf1->spine0", "queueing"),
                  EventDoc(1 * S, "link_down", "leaf0-spine1", "all lost"),
                  EventDoc(2 * S, "prober_down", "host2"),
                  EventDoc(3 * S, "clear", "host2", "prober back", "info"),
                  EventDoc(3 * S, "topology", "fabric")], 3 * S)  # fmt: skip
    assert before.changed
    save(tmp_path, before)  # the predecessor is killed after this
    assert not before.changed
    after = OpenFindings(load(tmp_path), grace_ns=20 * S)
    assert sorted(after.inherited) == ["leaf0-spine1", "leaf1->spine0"]
    # the successor finds the contention again: consumers already hold it open
    out = after.apply([EventDoc(10 * S, "contention", "leaf1->spine0", "queueing")], 10 * S)
    assert out == []
    # the link came back while it was down: nobody raises it, the grace clears it
    assert after.apply([], 29 * S) == []
    (gone,) = after.apply([], 30 * S)
    assert (gone.kind, gone.target) == ("clear", "leaf0-spine1")
    assert gone.detail == "link_down not found again after the controller's restart"
    # what it confirmed is cleared as any finding is
    out = after.apply([EventDoc(40 * S, "clear", "leaf1->spine0", "recovered", "info")], 40 * S)
    assert _kinds(out) == [("clear", "leaf1->spine0")] and after.held() == []


def test_a_new_finding_and_another_kind_on_an_inherited_target_go_out() -> None:
    f = OpenFindings([EventDoc(1, "loss", "leaf0-spine0")])
    out = f.apply([EventDoc(5, "link_down", "leaf0-spine0"), EventDoc(5, "loss", "nic3")], 5)
    assert _kinds(out) == [("link_down", "leaf0-spine0"), ("loss", "nic3")]
    assert _kinds(f.held()) == [("link_down", "leaf0-spine0"), ("loss", "nic3")]


def test_no_file_is_nothing_open_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    assert load(tmp_path) == []
    ev = EventDoc(1, "contention", "leaf1->spine0")
    (tmp_path / FILE).write_bytes(ev.encode() + b"\n" + b'{"t_ns": 2, "ki')
    assert load(tmp_path) == [ev]


def test_a_raise_of_what_is_open_is_not_sent_again_until_it_is_cleared() -> None:
    f = OpenFindings()
    flap = EventDoc(1 * S, "link_flap", "leaf0-spine1", "flapped 2 times")
    assert _kinds(f.apply([flap], 1 * S)) == [("link_flap", "leaf0-spine1")]
    assert f.apply([EventDoc(4 * S, "link_flap", "leaf0-spine1", "flapped 3 times")], 4 * S) == []
    f.apply([EventDoc(9 * S, "clear", "leaf0-spine1", "recovered", "info")], 9 * S)
    out = f.apply([EventDoc(20 * S, "link_flap", "leaf0-spine1", "flapped 2 times")], 20 * S)
    assert _kinds(out) == [("link_flap", "leaf0-spine1")]  # a new flap after the clear


def test_an_inherited_flap_found_again_after_a_down_is_not_raised_again() -> None:
    # the successor's fresh brain sees the flapping link's next down as a down first, then
    # the one after as a flap: the flap its predecessor raised is still open
    f = OpenFindings([EventDoc(1 * S, "link_flap", "leaf0-spine1", "flapped 2 times")])
    out = f.apply([EventDoc(5 * S, "link_down", "leaf0-spine1", "all lost")], 5 * S)
    assert _kinds(out) == [("link_down", "leaf0-spine1")]
    assert f.apply([EventDoc(8 * S, "link_flap", "leaf0-spine1", "flapped 2 times")], 8 * S) == []
