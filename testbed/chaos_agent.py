"""One rank's recovery agent without a training job, for ``qpmesh testbed chaos``.

``python -m testbed.chaos_agent --broker H:P --job J --rank K --nics nic2,nic3 --log F``
runs what a rank of a job runs to follow qpmesh (`recovery.follow.Follower`: its rank
registration, retained, and the remediation topics of its NICs; `recovery.machine`: the
decisions and their acks) on a step loop with no collective: a step boundary every
``--step-s``, and a re-form is done as soon as it is asked for (there is no group to build).
A gloo job per rank costs seconds of torch import and a rendezvous on this testbed's busy
2-core machine (`testbed.recovery_demo` runs one); the agent's part, the part qpmesh talks
to, is the same. Its JSON-lines log (``--log``) says ``ready`` once connected and every
action and ack, so the harness can tell when a restarted agent follows again and which
actions reached it (``ready``: connected to the broker, its subscriptions on their way).
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import time
from collections.abc import Sequence
from typing import Any

from contract.remediation import AckDoc, ActionDoc
from recovery.follow import Follower
from recovery.machine import (
    Ack,
    ActionReceived,
    AgentConfig,
    Event,
    Reform,
    ReformDone,
    SafePoint,
    handle,
    initial,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the agent until killed; return 2 on bad arguments."""
    p = argparse.ArgumentParser(prog="python -m testbed.chaos_agent", description=__doc__)
    p.add_argument("--broker", required=True, help="HOST:PORT of the MQTT broker")
    p.add_argument("--job", required=True, help="job id")
    p.add_argument("--rank", type=int, required=True, help="this rank")
    p.add_argument("--nics", required=True, help="this rank's NICs, preferred first")
    p.add_argument("--log", required=True, help="JSON-lines log (appended)")
    p.add_argument("--step-s", type=float, default=0.2, help="seconds per step")
    a = p.parse_args(argv)
    host, _, port = a.broker.rpartition(":")
    nics = tuple(a.nics.split(","))
    cfg = AgentConfig(a.job, a.rank, nics)
    out = open(a.log, "a", buffering=1)  # noqa: SIM115 (open for the process's life)

    def log(msg: str, **kw: Any) -> None:
        out.write(json.dumps({"t_ns": time.time_ns(), "msg": msg, **kw}) + "\n")

    inbox: queue.Queue[ActionDoc] = queue.Queue()
    follower = Follower(host, int(port), nics, inbox, client_id=f"{a.job}-r{a.rank}")
    follower.start()  # connected (raises OSError when the broker cannot be reached)
    follower.register(a.job, a.rank, "chaos", nics)
    log("ready", job=a.job, rank=a.rank, nics=list(nics))
    st = initial(cfg)
    step = 0
    while True:
        events: list[Event] = []
        while not inbox.empty():
            doc = inbox.get()
            log("action", id=doc.id, kind=doc.kind, target=doc.target, job=doc.job)
            events.append(ActionReceived(doc))
        step += 1
        events.append(SafePoint(step))
        while events:
            st, cmds = handle(cfg, st, events.pop(0), time.time_ns())
            for c in cmds:
                if isinstance(c, Ack):
                    follower.ack(AckDoc(c.action, cfg.receiver, c.outcome, time.time_ns(),
                                        c.detail))  # fmt: skip
                    log("ack", id=c.action, outcome=c.outcome)
                elif isinstance(c, Reform):
                    events.append(ReformDone(c.gen, c.nic))
        time.sleep(a.step_s)


if __name__ == "__main__":
    sys.exit(main())
