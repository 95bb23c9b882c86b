"""One rank of the recovery demo's training job (run inside a testbed host namespace).

A small deterministic job: a linear model in float64, data drawn per (seed, step, rank), the
gradient summed over ranks by all-reduce each step, plain SGD. ``--mode plain`` is a stock
gloo job (one process group, the job's collective timeout); ``--mode agent`` runs the same
steps through the recovery agent (`recovery.gloo.RecoverableGloo`) following the remediation
topics of its NICs. Writes a JSON result (completed, seconds, checksum, failure time, re-forms,
acks) to ``--out``; rank 0 publishes its step count in the store (``demo/step``) so the demo
driver can cut the link mid-run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import queue
import socket
import sys
import time
from typing import Any

from mqttlink.settings import add_security_args, security_from_args


def _data(seed: int, step: int, rank: int, dim: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + rank)
    x = torch.randn(64, dim, generator=g, dtype=torch.float64)
    y = torch.randn(64, dim, generator=g, dtype=torch.float64)
    return x, y


def _grad(params: Any, x: Any, y: Any, dim: int) -> Any:
    import torch

    w = params[: dim * dim].view(dim, dim).clone().requires_grad_(True)
    b = params[dim * dim :].clone().requires_grad_(True)
    loss = ((torch.tanh(x @ w + b) - y) ** 2).mean()
    gw, gb = torch.autograd.grad(loss, (w, b))
    return torch.cat([gw.reshape(-1), gb.reshape(-1)])


def main(argv: list[str] | None = None) -> int:
    """Run one rank; return 0 when all steps completed, 1 otherwise (the result file says why)."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rank", type=int, required=True, help="this rank")
    p.add_argument("--world", type=int, required=True, help="number of ranks")
    p.add_argument("--store", required=True, help="host:port of the rendezvous TCPStore")
    p.add_argument("--nics", required=True, help="this rank's NICs (interfaces), preferred first")
    p.add_argument(
        "--mode",
        choices=("plain", "agent"),
        default="plain",
        help="stock gloo job or through the agent",
    )
    p.add_argument("--broker", default="", help="host:port of the MQTT broker (agent mode)")
    p.add_argument("--job", default="demo", help="job id (default %(default)s)")
    p.add_argument("--steps", type=int, default=60, help="training steps (default %(default)s)")
    p.add_argument("--step-s", type=float, default=0.05, help="emulated compute per step")
    p.add_argument("--dim", type=int, default=32, help="model width (default %(default)s)")
    p.add_argument("--seed", type=int, default=7, help="data and init seed (default %(default)s)")
    p.add_argument(
        "--timeout-s", type=float, default=4.0, help="plain: the job's collective timeout"
    )
    p.add_argument("--collective-timeout-s", type=float, default=1.0, help="agent: short timeout")
    p.add_argument(
        "--verdict-wait-s", type=float, default=8.0, help="agent: wait for a verdict when stuck"
    )
    p.add_argument("--out", required=True, help="result JSON file")
    p.add_argument("--action-verify-key", metavar="FILE", default="",
                   help="agent: ed25519-public key file; only actions the controller signed "
                   "with it are acted on (docs/security.md)")  # fmt: skip
    add_security_args(p)
    a = p.parse_args(argv)

    import logging

    import torch
    import torch.distributed as _dist

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    dist: Any = _dist
    torch.set_num_threads(1)
    host, port = a.store.rsplit(":", 1)
    nics = tuple(a.nics.split(","))
    res: dict[str, Any] = {"rank": a.rank, "mode": a.mode, "nics": list(nics), "completed": False}
    store = dist.TCPStore(host, int(port), a.world, False, timeout=dt.timedelta(seconds=60))
    n = a.dim * a.dim + a.dim
    params = torch.zeros(n, dtype=torch.float64)
    torch.manual_seed(a.seed)
    params.copy_(torch.randn(n, dtype=torch.float64) * 0.1)
    prev = params.clone()
    lr = 0.05
    acks: list[dict[str, Any]] = []
    follower = None
    agent = None
    pg: Any = None
    if a.mode == "agent":
        from recovery.follow import Follower
        from recovery.gloo import RecoverableGloo
        from recovery.machine import SEC, AgentConfig
        from recovery.perf import StepMeter

        inbox: queue.Queue[Any] = queue.Queue()
        bhost, bport = a.broker.rsplit(":", 1)
        from contract.keys import ED25519_PUBLIC, load_key_file

        verify = load_key_file(a.action_verify_key, ED25519_PUBLIC) if a.action_verify_key else None
        follower = Follower(bhost, int(bport), nics, inbox, client_id=f"{a.job}-r{a.rank}",
                            security=security_from_args(a), verify_keys=verify)  # fmt: skip
        follower.start()
        follower.register(a.job, a.rank, socket.gethostname(), nics)
        cfg = AgentConfig(a.job, a.rank, nics, verdict_wait_ns=int(a.verdict_wait_s * SEC))

        def ack(doc: Any) -> None:
            acks.append(doc.to_dict())
            assert follower is not None
            follower.ack(doc)

        agent = RecoverableGloo(cfg, store, a.world, inbox=inbox, ack=ack,
                                collective_timeout_s=a.collective_timeout_s)  # fmt: skip
        agent.start()
        meter = StepMeter(a.job, a.rank)
        meter.step(time.time_ns())
    else:
        gloo: Any = dist.ProcessGroupGloo
        opts = gloo._Options()
        opts._devices = [gloo.create_device(interface=nics[0])]
        opts._timeout = dt.timedelta(seconds=a.timeout_s)
        # every rank up first: the group's connect shares the short collective timeout, and a
        # rank still importing torch on a busy host made the other's connect fail in 3 s
        store.set(f"demo/up/{a.rank}", "1")
        store.wait([f"demo/up/{r}" for r in range(a.world)])
        pg = gloo(store, a.rank, a.world, opts)
    store.set("demo/ready/" + str(a.rank), "1")
    t0 = time.time()
    res["t0_wall"] = t0
    step = 0
    step_done_wall: list[float] = []
    try:
        while step < a.steps:
            time.sleep(a.step_s)
            x, y = _data(a.seed, step, a.rank, a.dim)
            g = _grad(params, x, y, a.dim)
            if agent is not None:
                from recovery.gloo import Reformed

                try:
                    agent.allreduce(g)
                except Reformed as r:
                    if r.step < step:
                        params.copy_(prev)  # one step ahead of a peer: undo it
                    step = r.step
                    continue
            else:
                pg.allreduce([g]).wait()
            prev.copy_(params)
            params.sub_(lr * g / a.world)
            step += 1
            step_done_wall.append(time.time())
            if a.rank == 0:
                store.set("demo/step", str(step))
            if agent is not None:
                meter.step(time.time_ns())
                meter.timeouts = agent.timeouts
                doc = meter.report(time.time_ns(), agent.state.nic)
                if doc is not None and follower is not None:
                    follower.report(doc)
                try:
                    agent.safe_point(step)
                except Reformed as r:
                    if r.step < step:
                        params.copy_(prev)
                    step = r.step
        res["completed"] = True
    except Exception as exc:  # the job's failure is the result of run 2
        res["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        res["failed_wall"] = time.time()
    res["seconds"] = time.time() - t0
    res["steps_done"] = step
    res["step_done_wall"] = step_done_wall
    res["param_checksum"] = float(params.sum().item())
    res["param_sha256"] = hashlib.sha256(params.numpy().tobytes()).hexdigest()
    if agent is not None:
        res["reforms"] = agent.reforms
        res["final_nic"] = agent.state.nic
    res["acks"] = acks
    with open(a.out, "w") as fh:
        json.dump(res, fh)
    if follower is not None:
        time.sleep(0.2)  # let QoS 1 acks leave
        follower.stop()
    sys.stdout.flush()
    import os

    os._exit(0 if res["completed"] else 1)  # abandoned gloo work must not block the exit


if __name__ == "__main__":
    sys.exit(main())
