"""The API's pure parts: tokens, token bucket, scopes, event queries, jobs and Control."""

from __future__ import annotations

import pytest

from contract.documents import EventDoc
from controller.api.auth import (
    Principal,
    TokenBucket,
    TokenError,
    TokenTable,
    bearer,
    parse_token_lines,
)
from controller.api.hub import snapshot_wait
from controller.api.server import parse_listen
from controller.api.views import BadQuery, event_matches, parse_event_query, tenant_scope
from controller.control import Control
from controller.jobs import Job, JobError, JobRegistry
from mesh.fabric import FabricShape, build_fabric


def test_token_bucket_refills_with_time_passed_in() -> None:
    b = TokenBucket.full(rate=2.0, burst=3.0, t_s=100.0)
    for _ in range(3):
        ok, b, _ = b.take(100.0)
        assert ok
    ok, b, wait = b.take(100.0)
    assert not ok and wait == pytest.approx(0.5)
    ok, b, _ = b.take(100.5)  # one token refilled
    assert ok
    ok, b, _ = b.take(99.0)  # time going backwards adds nothing
    assert not ok
    ok, b, _ = b.take(1000.0)  # refills only up to burst
    assert ok and b.tokens == pytest.approx(2.0)
    with pytest.raises(ValueError):
        TokenBucket.full(0.0, 1.0, 0.0)


def test_token_file_and_bearer_header() -> None:
    table = parse_token_lines(
        ["# comment", "operator ops op-token-123", "", "tenant acme acme-token-1  # x"], "t"
    )
    assert table.lookup("op-token-123") == Principal("operator", "ops")
    assert table.lookup("acme-token-1") == Principal("tenant", "acme")
    assert table.lookup("nope-nope-nope") is None
    for bad in (["admin x tok-tok-tok"], ["operator ops"], ["tenant a short"],
                ["operator a tok-tok-tok", "tenant b tok-tok-tok"]):  # fmt: skip
        with pytest.raises(TokenError, match=r"^t:\d+: "):
            parse_token_lines(bad, "t")
    assert bearer("Bearer abc") == "abc"
    assert bearer("bearer  abc ") == "abc"
    for bad_h in (None, "", "Basic abc", "Bearer", "Bearer a b"):
        assert bearer(bad_h) is None
    with pytest.raises(TokenError):
        TokenTable({"short": Principal("operator", "x")})


def test_tenant_scope_sees_its_nics_hosts_and_the_links_between_them() -> None:
    fab = build_fabric(FabricShape(leaves=4, spines=2, hosts_per_leaf=2, nics_per_host=2))
    one_leaf = [n.id for n in fab.nics if n.leaf == "leaf0"][:2]
    s = tenant_scope(fab, one_leaf)
    assert s.nics == frozenset(fab.nic_index[n] for n in one_leaf)
    assert all(lk.startswith("nic") for lk in s.links or ())  # same leaf: no uplinks
    two = [*one_leaf, next(n.id for n in fab.nics if n.leaf == "leaf2")]
    s2 = tenant_scope(fab, two)
    assert s2.links is not None and "leaf0-spine1" in s2.links and "leaf2-spine0" in s2.links
    assert "leaf1-spine0" not in s2.links
    assert s2.target_visible(fab, "leaf0-spine0")
    other = next(n.id for n in fab.nics if n.leaf == "leaf3")
    assert not s2.target_visible(fab, other)
    assert tenant_scope(fab, ["ghost"]).nics == frozenset()


def test_event_query_rejects_malformed_filters() -> None:
    q = parse_event_query({"since_ns": "5", "until_ns": "9", "severity": "critical"})
    assert (q.since_ns, q.until_ns, q.severity, q.limit) == (5, 9, "critical", 200)
    for bad in ({"since_ns": "x"}, {"limit": "0"}, {"limit": "100000"}, {"severity": "bad"},
                {"bogus": "1"}, {"kind": ""}, {"since_ns": "-1"}, {"limit": "+5"},
                {"limit": " 5 "}, {"limit": "5_0"}, {"limit": "\u0663"}, {"since_ns": "1_7"},
                {"target": "x" * 129}):  # fmt: skip
        with pytest.raises(BadQuery):
            parse_event_query(bad)
    # an end not after the start is an empty range, not an error (OpenAPI cannot say it)
    empty = parse_event_query({"since_ns": "9", "until_ns": "9"})
    assert not event_matches(EventDoc(9, "link_flap", "x"), empty)


def test_job_registry_and_control_audit() -> None:
    reg = JobRegistry()
    reg.register(Job("j1", "acme", (("nic0", "nic1"), ("nic2",))))
    reg.register(Job("j2", "beta", (("nic5",),)))
    assert reg.tenant_nics("acme") == {"nic0", "nic1", "nic2"}
    assert reg.tenant_nics("nobody") == frozenset()
    with pytest.raises(JobError):
        reg.register(Job("j1", "acme", (("nic3",),)))
    assert reg.unregister("j1").tenant == "acme"
    with pytest.raises(JobError):
        reg.unregister("j1")
    with pytest.raises(JobError):
        Job("j3", "acme", ())
    seen = []
    ctl = Control(False, on_change=seen.append)
    ch = ctl.set(True, "ops", 7)
    assert ctl.enabled and ch.previous is False and seen == [ch] and ctl.audit() == (ch,)
    with pytest.raises(ValueError):
        ctl.set(False, "", 8)


def test_snapshot_coalescing_and_listen_parsing() -> None:
    assert snapshot_wait(None, 5.0, 0.25) == 0.0
    assert snapshot_wait(5.0, 5.1, 0.25) == pytest.approx(0.15)
    assert snapshot_wait(5.0, 6.0, 0.25) == 0.0
    assert parse_listen("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("8080", "host:", ":80", "h:99999", "h:x"):
        with pytest.raises(ValueError):
            parse_listen(bad)
