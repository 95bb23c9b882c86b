"""A send the OS refuses (a netfilter drop) is a lost probe, and the NIC measures again after.

Regression (recovery-demo, nftables black-hole of a NIC link): the kernel numbers a datagram
for SO_TIMESTAMPING's OPT_ID when it builds it, before netfilter drops it, so every refused
send left the endpoint's count one behind the kernel's and each later TX stamp of that socket
was matched to no send: after a 0.5 s cut the NIC's probes never completed again (the
controller saw the NIC quiet and never cleared it). The kernel part needs root and nft: the
endpoints run in a fresh network namespace with a unique name, removed in ``finally``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from contract.records import MISSING
from prober.events import ProbeLost, results_to_batch
from prober.session import ProbeSession
from prober.wire import Codec

KEY = b"r" * 32
ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, subprocess, sys
    from prober.events import ProbeLost, ProbeResult
    from prober.fastudp import BatchUdpEndpoint
    from prober.session import ProbeSession
    from prober.udp import UdpEndpoint
    from prober.wire import Codec

    from prober.compiled import CompiledSession, CompiledUdpEndpoint
    from prober.drive import CompiledDriver
    PATH = sys.argv[1]
    CLS = {"per-datagram": UdpEndpoint, "batched": BatchUdpEndpoint,
           "compiled": CompiledUdpEndpoint, "compiled-driven": CompiledUdpEndpoint,
           "compiled-driven-pernic": CompiledUdpEndpoint}[PATH]
    DRIVEN = PATH.startswith("compiled-driven")
    LO = "127.0.0.1"

    def session(nic, **kw):
        if PATH.startswith("compiled"):  # the C engine has no HMAC: unauthenticated
            return CompiledSession(nic, **kw)
        return ProbeSession(nic, Codec(b"r" * 32), **kw)

    async def main():
        got = []
        a = CLS(session("nicA", timeout_ns=3_000_000_000), LO, dport=0, on_events=got.extend)
        b = CLS(session("nicB"), LO, dport=0)
        if DRIVEN:  # as in the agent: one shared timer ticks both
            a.external_ticks = b.external_ticks = True
        await a.start(); await b.start()
        if DRIVEN:  # batched (one C call for both) or each NIC ticked from Python
            drv = CompiledDriver([a, b], batch=PATH == "compiled-driven")
            assert drv.batched is (PATH == "compiled-driven")
            tasks = [asyncio.create_task(drv.run())]
        else:
            tasks = [asyncio.create_task(e.run()) for e in (a, b)]
        sport = a.add_source_port(0)

        async def burst(n, want):
            got.clear()
            for _ in range(n):
                a.session.queue_probe("nicB", (LO, b.dport), sport, a.now_ns())
                a.wake()
                await asyncio.sleep(0.01)
            def evs():
                if DRIVEN:  # records wait in the engine for the agent's batch
                    got.extend(a.session.take_events())
                return [x for e in got for x in (e.events() if hasattr(e, "events") else [e])]

            for _ in range(400):  # up to ~4 s: the probe timeout is 3 s
                if sum(isinstance(e, want) for e in evs()) >= n:
                    break
                await asyncio.sleep(0.01)
            return {"results": sum(isinstance(e, ProbeResult) for e in evs()),
                    "lost": sum(isinstance(e, ProbeLost) for e in evs())}

        out = {"before": await burst(5, ProbeResult)}
        rule = ("table inet qpmrefused {\\n  chain o { type filter hook output priority 0; "
                f"policy accept; udp dport {b.dport} counter drop; }}\\n}}\\n")
        subprocess.run(["nft", "-f", "-"], input=rule.encode(), check=True)
        out["cut"] = await burst(5, ProbeLost)
        out["refused"] = a.session.counters["send_refused"]
        subprocess.run(["nft", "delete", "table", "inet", "qpmrefused"], check=True)
        out["after"] = await burst(10, ProbeResult)
        out["renumbered"] = a.counters["socket_renumbered"]
        for e in (a, b):
            e.close()
        for t in tasks:
            t.cancel()
        print(json.dumps(out))

    asyncio.run(main())
    """
)


def test_refused_probe_is_reported_lost_at_once_with_its_send_time() -> None:
    s = ProbeSession("nicA", Codec(KEY), timeout_ns=1_000_000_000)
    (d,) = s.send_probe("nicB", ("127.0.0.1", 4791), 50000, 1_000)
    (ev,) = s.send_refused(d.meta.token)
    assert isinstance(ev, ProbeLost)
    assert (ev.src, ev.dst, ev.sport, ev.t1, ev.sent_ns) == ("nicA", "nicB", 50000, MISSING, 1_000)
    assert s.counters["send_refused"] == 1 and s.counters["lost"] == 1
    assert s.pending == 0
    assert s.poll(10_000_000_000) == []  # not reported a second time at its timeout
    assert s.send_refused(d.meta.token) == []  # unknown by now


def test_lost_record_without_tx_stamp_carries_its_send_time() -> None:
    ev = ProbeLost(7, "nicA", "nicB", 50000, -1, 0, MISSING, 123_456)
    batch = results_to_batch([ev], origin="h")
    assert int(batch.t1[0]) == 123_456 and bool(batch.lost[0])
    stamped = ProbeLost(8, "nicA", "nicB", 50000, -1, 0, 99, 123_456)
    assert int(results_to_batch([stamped], origin="h").t1[0]) == 99


@pytest.mark.parametrize(
    "path", ["per-datagram", "batched", "compiled", "compiled-driven", "compiled-driven-pernic"]
)
def test_netfilter_refused_sends_are_lost_and_stamps_resume(path: str) -> None:
    if os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("ip") is None:
        pytest.skip("needs root, ip and nft")
    ns = f"qpmref{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", SCRIPT, path],
            capture_output=True, text=True, env=env, timeout=60, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert out["before"] == {"results": 5, "lost": 0}
    assert out["cut"]["lost"] == 5 and out["cut"]["results"] == 0
    assert out["refused"] == 5  # reported when refused, not at the 3 s timeout
    assert out["renumbered"] >= 1
    # the old code: 0 results (every TX stamp matched to no send, probes incomplete)
    assert out["after"] == {"results": 10, "lost": 0}
