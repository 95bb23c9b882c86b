"""The --secure adversary's pieces without a testbed: forged datagrams, the scoring, the ACL."""

from __future__ import annotations

import pytest

from prober.wire import AuthError, Codec
from testbed.adversary import Sent, forged_datagrams, score
from testbed.securebroker import acl_text


def test_forged_datagrams_never_pass_a_keyed_codec() -> None:
    grams = forged_datagrams("nic0", "nic1", 10, seed=1)
    assert len(grams) == 10
    fabric = Codec(b"k" * 32)
    for g in grams:
        with pytest.raises(AuthError):
            fabric.decode(g)


def _sent() -> Sent:
    s = Sent(probes={"host0": 40, "host1": 40})
    s.foreign_topic.append(("p/probes/host0", "host0", 12, "aa"))
    s.foreign_origin.append(("p/probes/host1", "host0", 13, "bb"))
    s.replayed.append(("p/probes/host1", "host1", 3, "cc"))
    s.actions.append("forged-1")
    return s


def test_score_counts_what_the_receivers_recorded() -> None:
    s = _sent()
    arrivals = [
        ("p/probes/host1", "host1", 3, "cc"),  # the original
        ("p/probes/host0", "host0", 12, "zz"),  # host0's real batch 12: not the forgery
        ("p/probes/host1", "host0", 13, "bb"),  # delivered: the ACL lets host1 use its topic
        ("p/probes/host1", "host1", 3, "cc"),  # the replay, delivered
    ]
    log = [
        {"msg": "bad message", "topic": "p/probes/host1", "reason": "origin host0 is not host1"},
        {"msg": "bad message", "topic": "p/probes/host1", "reason": "replayed batch 3 from host1"},
    ]
    out = score(s, arrivals, log, {"host0": 2}, {"host0": 42, "host1": 40}, ["real-action"])
    assert out["forged_probes_sent"] == 80 and out["forged_probes_accepted"] == 0
    assert out["forged_batches_delivered_by_broker"] == 1
    assert out["forged_batches_accepted"] == 0 and out["replayed_batches_accepted"] == 0
    assert out["forged_actions_accepted"] == 0
    # and when the receivers took them, the figures say so
    out = score(s, arrivals, [], {}, {"host0": 30}, ["forged-1"])
    assert out["forged_probes_accepted"] == 50
    assert out["forged_batches_accepted"] == 1 and out["replayed_batches_accepted"] == 1
    assert out["forged_actions_accepted"] == 1


def test_acl_limits_probers_to_their_host_and_agents_to_their_nics() -> None:
    text = acl_text("qpmesh/v1", agents={"agent-j-r0": ("j", ["nic3"])})
    assert "pattern write qpmesh/v1/probes/%u" in text
    assert (
        "pattern write qpmesh/v1/neighbors/%u" in text
        and "pattern read qpmesh/v1/neighbors/+" in text
    )
    assert "topic readwrite qpmesh/v1/remediation/#" in text.split("user controller")[1]
    agent = text.split("user agent-j-r0")[1]
    assert "topic read qpmesh/v1/remediation/nic3" in agent and "probes" not in agent
