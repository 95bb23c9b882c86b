"""The congested leaf again, a capture in which one of the leaf's two NICs has its clock
withheld for seconds at a time, replayed offline.

`tests/fixtures/leaf_congested_nic_withheld/` holds what the controller read in `qpmesh
testbed run testbed/scenarios/leaf_uplinks_congested.toml --seed 1` (eleventh session; both
uplinks of leaf0 queued both ways from 15 s, the capture cut 13 s later). With one NIC's
delays withheld, the other's one-way delays all cross its own link and one queued uplink,
and nothing judged in the window tells the two apart: the controller blamed `nic1->leaf0`
and `leaf0->nic0` beside the uplinks (at solve delays 0 and 1 s). The two NICs' round trips
with each other need no clock and show no queue on either NIC's link
(`controller.detect.roundtrips`); the replay must blame the uplinks and no NIC link."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from testbed.replay import CAPTURE, replay

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "leaf_congested_nic_withheld"


@pytest.mark.parametrize("solve_delay_s", [0.0, 1.0])
def test_a_withheld_nic_leaves_no_blame_on_the_nic_links(
    tmp_path: Path, solve_delay_s: float
) -> None:
    for name in ("controller.toml", "clocks.json", "report.json"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    with gzip.open(FIXTURE / "mqtt.jsonl.gz", "rb") as src, (tmp_path / CAPTURE).open("wb") as dst:
        shutil.copyfileobj(src, dst)
    r = replay(tmp_path, solve_delay_s=solve_delay_s)
    raised = [e.target for e in r.events if e.kind == "contention"]
    links = {frozenset(t.split("->")) for t in raised}
    assert links == {frozenset(("leaf0", "spine0")), frozenset(("leaf0", "spine1"))}, raised
    assert not any("nic" in e.target for e in r.events), [(e.kind, e.target) for e in r.events]
    assert r.delay_trust[2] > 0  # delays were withheld: the case the round trips are for
