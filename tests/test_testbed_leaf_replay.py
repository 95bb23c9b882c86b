"""A real testbed capture of a leaf whose every uplink is congested, replayed offline.

`tests/fixtures/leaf_uplinks_congested/` holds what the controller read in `qpmesh testbed run
testbed/scenarios/leaf_uplinks_congested.toml --seed 1` (real namespaces, kernel stamps, both
uplinks of leaf0 queued by generators at 1.6x the shaped rate from 15 s; the capture cut 13 s
later). That run's controller blamed `leaf0->nic0` and `leaf0->nic1` beside the two uplinks:
the queue estimate's per-hop medians settled on the NIC hops until the lift between sweeps
(`controller.detect.queues`); the replay must blame the two uplinks and nothing else."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

from testbed.replay import CAPTURE, clock_check, replay

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "leaf_uplinks_congested"


def _links(target: str) -> frozenset[str]:
    return frozenset(target.split("->"))


def test_the_congested_leaf_is_blamed_on_its_uplinks_not_its_nics(tmp_path: Path) -> None:
    for name in ("controller.toml", "clocks.json", "report.json"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    with gzip.open(FIXTURE / "mqtt.jsonl.gz", "rb") as src, (tmp_path / CAPTURE).open("wb") as dst:
        shutil.copyfileobj(src, dst)
    check, on_tick = clock_check(tmp_path)
    r = replay(tmp_path, on_tick=on_tick)
    raised = {e.target for e in r.events if e.kind == "contention"}
    assert {_links(t) for t in raised} == {_links("leaf0->spine0"), _links("leaf0->spine1")}, raised
    assert not any("nic" in e.target for e in r.events), [(e.kind, e.target) for e in r.events]
    assert check is not None
    congested = check.report()["congested"]
    assert congested["fine"] and congested["withheld"], congested  # trusted, then not
