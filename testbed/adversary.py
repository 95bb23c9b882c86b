"""The adversary of ``qpmesh testbed run --secure``: what it sends, and what got through.

It holds one compromised host's valid MQTT credentials and a place in the fabric, but not the
fabric's probe key:

- forged probe datagrams (`forged_datagrams`): PROBE, REPLY and FOLLOW_UP claiming a real
  NIC as sender, untagged or tagged with a key the fabric does not have, sent with UDP from the
  compromised host's namespace (``python -m testbed.adversary probes ...``, `send_datagrams`);
- batches as another host (`mqtt_attacks`): a copy of the victim's latest batch under the
  victim's topic (the ACL refuses it) and under its own topic with the victim as origin (the
  controller's origin check must drop it);
- a replay: one of its own host's old batches published again (the controller drops it);
- a forged remediation action for the victim's NIC (the ACL refuses it; a follower of that
  NIC counts what reaches it).

`score` (pure) turns what was sent and what the run recorded (the monitor's deliveries, the
controller's JSON-lines log, the probers' health counters, the agent's received actions) into
the report's ``security`` section; "accepted" is read from the receivers' own records, never
from what the adversary hoped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from contract.records import ProbeBatch, encode_batch
from contract.remediation import ActionDoc, action_topic
from prober.wire import Codec, Message, MsgType, nic_hash
from testbed.runreport import digest

FORGED_ACTION_PREFIX = "forged-"


def forged_datagrams(sender: str, target: str, n: int, seed: int = 0) -> list[bytes]:
    """Return ``n`` forged probe datagrams from NIC ``sender`` to NIC ``target`` (pure).

    They cycle through: an untagged PROBE, a PROBE, a one-step REPLY and a FOLLOW_UP tagged
    with a random key (not the fabric's), and an untagged REPLY.
    """
    rng = random.Random(seed)
    wrong = Codec(rng.randbytes(32))
    plain = Codec()
    s, p = nic_hash(sender), nic_hash(target)
    out: list[bytes] = []
    for i in range(n):
        seq = rng.randrange(1 << 32)
        t2 = rng.randrange(1 << 40, 1 << 62)
        k = i % 5
        if k == 0:
            out.append(plain.encode(Message(MsgType.PROBE, s, p, seq)))
        elif k == 1:
            out.append(wrong.encode(Message(MsgType.PROBE, s, p, seq)))
        elif k == 2:
            out.append(wrong.encode(Message(MsgType.REPLY, s, p, seq, ta=t2, tb=t2 + 900,
                                            t3_final=True)))  # fmt: skip
        elif k == 3:
            out.append(wrong.encode(Message(MsgType.FOLLOW_UP, s, p, seq, ta=t2, tb=t2 + 900)))
        else:
            out.append(plain.encode(Message(MsgType.REPLY, s, p, seq, ta=t2, tb=t2 + 900,
                                            t3_final=True)))  # fmt: skip
    return out


def send_datagrams(targets: Sequence[tuple[str, int, list[bytes]]]) -> int:
    """Send each target's datagrams with UDP (``(address, port, datagrams)``); return the
    number sent. Raises OSError when the socket cannot send."""
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for addr, port, grams in targets:
            for g in grams:
                sock.sendto(g, (addr, port))
                sent += 1
    return sent


def with_seq(batch: ProbeBatch, *, origin: str | None = None, batch_seq: int) -> bytes:
    """Return ``batch`` encoded with another ``batch_seq`` (and ``origin``)."""
    return encode_batch(dataclasses.replace(batch, origin=origin or batch.origin,
                                            batch_seq=batch_seq))  # fmt: skip


def forged_action(nic: str, now_ns: int) -> ActionDoc:
    """Return a "move off this NIC" action the controller never decided."""
    return ActionDoc(id=f"{FORGED_ACTION_PREFIX}{now_ns}", kind="move_off_nic",
                     reason="forged by the testbed adversary", finding="none",
                     issued_at_ns=now_ns, expires_at_ns=now_ns + 60_000_000_000,
                     nic=nic)  # fmt: skip


Published = tuple[str, str, int, str]  # topic, origin, batch_seq, `testbed.runreport.digest`


@dataclasses.dataclass
class Sent:
    """What the adversary sent: probe datagrams per target host, and MQTT messages as
    (topic, origin, batch_seq, payload digest) per attack."""

    probes: dict[str, int] = dataclasses.field(default_factory=dict)
    foreign_topic: list[Published] = dataclasses.field(default_factory=list)
    foreign_origin: list[Published] = dataclasses.field(default_factory=list)
    replayed: list[Published] = dataclasses.field(default_factory=list)
    actions: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    not_tried: dict[str, str] = dataclasses.field(default_factory=dict)


async def mqtt_attacks(
    client: Any,
    prefix: str,
    *,
    own_host: str,
    victim: ProbeBatch,
    own_old: ProbeBatch | None,
    action_nic: str,
    now_ns: int,
    sent: Sent,
) -> None:
    """Publish the batch and action attacks with ``client`` (an aiomqtt client logged in
    with ``own_host``'s credentials); record them in ``sent``. Broker errors propagate."""
    vt = f"{prefix}/probes/{victim.origin}"
    ot = f"{prefix}/probes/{own_host}"
    # unseen so far: no dedupe hides it (its real twin comes later, with other contents)
    seq = victim.batch_seq + 2
    for topic, s, bucket in ((vt, seq, sent.foreign_topic), (ot, seq + 1, sent.foreign_origin)):
        data = with_seq(victim, batch_seq=s)
        await client.publish(topic, data, qos=1, timeout=10)
        bucket.append((topic, victim.origin, s, digest(data)))
    if own_old is None:
        sent.not_tried["replay"] = "no old batch of the compromised host was seen"
    else:
        data = encode_batch(own_old)
        await client.publish(ot, data, qos=1, timeout=10)
        sent.replayed.append((ot, own_old.origin, own_old.batch_seq, digest(data)))
    act = forged_action(action_nic, now_ns)
    await client.publish(action_topic(prefix, action_nic), act.encode(), qos=1, timeout=10)
    sent.actions.append(act.id)


def score(
    sent: Sent,
    arrivals: Sequence[Published],
    controller_log: Sequence[Mapping[str, Any]],
    bad_auth_before: Mapping[str, int],
    bad_auth_after: Mapping[str, int],
    actions_received: Sequence[str],
    prefix: str = "qpmesh/v1",
) -> dict[str, Any]:
    """Return the report's ``security`` section (pure).

    ``arrivals``: (topic, origin, batch_seq, digest) of every probe batch the monitor (a
    reader of every topic) received; ``controller_log``: the controller's JSON-lines log; ``bad_auth_*``:
    the probers' ``bad_auth`` health counters per host before the probe attack and at the end;
    ``actions_received``: ids of the actions the victim NIC's follower took.

    - forged probes accepted = sent - the targets' bad_auth increase (a forged datagram lost
      on the way counts as accepted: the figure errs against us);
    - forged batches accepted = delivered to subscribers - dropped by the controller (its
      ``bad message`` lines on that topic that are not replays); a batch the ACL refused is
      delivered to nobody;
    - replays accepted = delivered - ``bad message`` lines ``replayed batch <seq> from <origin>``;
    - forged actions accepted = the follower's received actions the adversary made.
    """
    bad = [x for x in controller_log if x.get("msg") == "bad message"]
    replay_drops = {str(x.get("reason", "")) for x in bad}
    forged = sent.foreign_topic + sent.foreign_origin
    delivered = [m for m in forged if m in set(arrivals)]
    other_drops = sum(
        1 for x in bad
        if x.get("topic") in {m[0] for m in forged}
        and not str(x.get("reason", "")).startswith("replayed batch")
    )  # fmt: skip
    forged_accepted = max(0, len(delivered) - other_drops)
    seen = [a[:3] for a in arrivals]
    replay_delivered = sum(1 for m in sent.replayed if seen.count(m[:3]) >= 2)  # first + replay
    replay_dropped = sum(
        1 for _, origin, seq, _ in sent.replayed
        if f"replayed batch {seq} from {origin}" in replay_drops
    )  # fmt: skip
    probes_sent = sum(sent.probes.values())
    rejected = sum(max(0, bad_auth_after.get(h, 0) - bad_auth_before.get(h, 0))
                   for h in sent.probes)  # fmt: skip
    forged_ids = set(sent.actions)
    return {
        "forged_probes_sent": probes_sent,
        "forged_probes_rejected": rejected,
        "forged_probes_accepted": max(0, probes_sent - rejected),
        "forged_batches_sent": len(forged),
        "forged_batches_delivered_by_broker": len(delivered),
        "forged_batches_dropped_by_controller": other_drops,
        "forged_batches_accepted": forged_accepted,
        "replayed_batches_sent": len(sent.replayed),
        "replayed_batches_delivered_by_broker": replay_delivered,
        "replayed_batches_dropped_by_controller": replay_dropped,
        "replayed_batches_accepted": max(0, replay_delivered - replay_dropped),
        "forged_actions_sent": len(sent.actions),
        "forged_actions_accepted": sum(1 for a in actions_received if a in forged_ids),
        "not_tried": dict(sent.not_tried),
        "errors": list(sent.errors),
        "prefix": prefix,
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m testbed.adversary probes``: send forged probes; print {"sent": {...}}."""
    p = argparse.ArgumentParser(description="send forged probe datagrams (testbed --secure)")
    p.add_argument("what", choices=("probes",))
    p.add_argument("--sender", required=True, help="NIC id the datagrams claim to come from")
    p.add_argument("--to", action="append", default=[], metavar="HOST:NIC=ADDR:PORT",
                   help="a target NIC (repeatable)")  # fmt: skip
    p.add_argument("--count", type=int, default=20, help="datagrams per target")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    per_host: dict[str, int] = {}
    targets: list[tuple[str, int, list[bytes]]] = []
    for i, spec in enumerate(a.to):
        try:
            who, where = spec.split("=", 1)
            host, nic = who.split(":", 1)
            addr, port = where.rsplit(":", 1)
            grams = forged_datagrams(a.sender, nic, a.count, seed=a.seed + i)
            targets.append((addr, int(port), grams))
        except ValueError:
            print(f"adversary: bad --to {spec!r} (want HOST:NIC=ADDR:PORT)", file=sys.stderr)
            return 2
        per_host[host] = per_host.get(host, 0) + len(grams)
    send_datagrams(targets)
    print(json.dumps({"sent": per_host}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
