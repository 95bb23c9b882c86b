"""`qpmesh testbed run --secure` end to end: TLS, passwords, ACL, probe HMAC and an adversary
(root only, ~60 s)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from tests.testbedcli import NETNS_MARKS
from tests.testbedcli import qpmesh as _qpmesh

pytestmark = NETNS_MARKS


@pytest.mark.timeout(200)
def test_secure_run_rejects_every_forgery_and_still_localizes(tmp_path: Path) -> None:
    prefix = "s" + secrets.token_hex(2) + "-"
    try:
        out = _qpmesh("testbed", "run", "testbed/scenarios/netns_small.toml", "--secure",
                      "--json", "--prefix", prefix, "--out", str(tmp_path), timeout=180)  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        rep = json.loads(out.stdout)
        sec = rep["security"]
        assert not sec["errors"] and not sec["not_tried"], sec
        # everything was tried ...
        assert sec["forged_probes_sent"] > 0 and sec["forged_batches_sent"] == 2, sec
        assert sec["replayed_batches_sent"] == 1 and sec["forged_actions_sent"] == 1, sec
        assert sec["replayed_batches_delivered_by_broker"] == 1, sec  # the ACL lets it by
        # ... and nothing got through (the receivers' own counters and logs)
        assert sec["forged_probes_accepted"] == 0, sec
        assert sec["forged_batches_accepted"] == 0, sec
        assert sec["replayed_batches_accepted"] == 0, sec
        assert sec["forged_actions_accepted"] == 0, sec
        # the mesh still works under TLS and HMAC: faults are localized as in the plain run
        loc = {x["fault"]: x for x in rep["localization"]}
        assert loc["flap"]["localized"], loc
        assert rep["probe_batches"] > 100
        # no secret in what the run printed or logged
        passwords = [p.read_text().strip() for p in (tmp_path / "pki" / "users").iterdir()]
        logs = out.stdout + out.stderr + (tmp_path / "controller.jsonl").read_text()
        logs += "".join(p.read_text() for p in tmp_path.glob("prober-*.log"))
        assert passwords and not any(pw in logs for pw in passwords)
    finally:
        _qpmesh("testbed", "down", "--prefix", prefix, timeout=60)
        st = _qpmesh("testbed", "status", "--prefix", prefix, "--json", timeout=30)
        doc = json.loads(st.stdout)
        assert not doc["namespaces"] and not doc["root_links"]
