"""The Soft-RoCE scenario, run inside the VM: two RDMA probers, a real broker, faults; JSON out.

``python -m testbed.rxevm.scenario --out DIR`` (as root, in a guest booted by
`testbed.rxevm.vm.run_in_vm`) does, in one boot:

1. `testbed.rxevm.guest.setup_script`: rxe0 on ``qpva`` (10.9.0.1), rxe1 on ``qpvb`` (10.9.0.2);
2. a private mosquitto on 127.0.0.1, a subscriber to ``<prefix>/probes/+`` and
   ``<prefix>/presence/+`` and ``<prefix>/health/+`` (records decoded with
   `contract.records.decode_batch`), and a packet
   sniffer on ``qpva`` that counts the RoCEv2 (UDP 4791) source ports really on the wire;
3. two probers (``qpmesh prober --transport rdma``): host ``ha`` with NIC ``a0`` on rxe0 and
   host ``hb`` with NIC ``b0`` on rxe1; each learns the other's QPN from retained presence;
4. phase ``clean`` (both directions answered), phase ``fault`` (netem drops every packet
   leaving ``qpva`` from one of a0's sweep source ports: a prio qdisc, a u32 filter on the UDP
   source port, ``netem loss 100%`` on that band), phase ``restart`` (``hb`` stopped by its PID
   and started again: a new QPN announced; ``ha`` must re-learn it).

Everything observed goes to ``DIR/result.json`` (records as rows, phase times in the guest's
clock, which is also the clock of the "sw" stamps, presence history, wire ports, exit codes,
rxe and link counters at the end, both rxe devices' counters as the prober's RDMA collector
reads them at the start and end of the clean and fault phases (``signals``; when each
device was read: ``signal_reads``),
log tails); the tests (tests/test_rxe.py) judge it. Processes started here are stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiomqtt

from contract.records import decode_batch
from prober.rdma.flowlabel import rxe_sport_of_qpn
from prober.telemetry.rdma import rdma_values, read_rdma_port
from testbed.rxevm.guest import RxePair, setup_script

REPO = Path(__file__).resolve().parents[2]
PREFIX = "rxe"
ROCE_PORT = 4791
TIMEOUT_MS = 8000  # a starved guest must not turn slow answers into losses


def prober_config(host: str, nic: str, dev: str, addr: str, peer: str, peer_addr: str,
                  broker_port: int) -> str:  # fmt: skip
    """Return the TOML of one RDMA prober with one NIC and one peer NIC (pure)."""
    return (
        f'[prober]\nhost = "{host}"\ntransport = "rdma"\ntimeout_ms = {TIMEOUT_MS}\n'
        f"batch_interval_ms = 250\n"
        f"[schedule]\nrate_hz = 10.0\npaths = 4\nseed = 7\n"
        f'[mqtt]\nhost = "127.0.0.1"\nport = {broker_port}\nprefix = "{PREFIX}"\n'
        f"timeout_s = 10.0\nbackoff_min_s = 0.1\nbackoff_max_s = 1.0\nkeepalive_s = 60\n"
        f"[telemetry]\ninterval_s = 5.0\n"
        f'[[nics]]\nid = "{nic}"\naddress = "{addr}"\nrdma_device = "{dev}"\ngid_index = 1\n'
        f'[[peers]]\nid = "{peer}"\naddress = "{peer_addr}"\n'
    )


class Observed:
    """What the subscriber and the sniffer saw (shared with the asyncio loop and a thread)."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []  # origin, stamp, src, dst, sport, seq, t1..t4, lost, rx_ns
        self.presence: list[dict[str, Any]] = []
        self.health: list[dict[str, Any]] = []
        self.wire: dict[str, Counter[int]] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def results(self, src: str, dst: str, after_ns: int = 0) -> int:
        """Return how many answered probes src -> dst with t1 > after_ns arrived."""
        return sum(1 for r in self.rows if r[2] == src and r[3] == dst and not r[10]
                   and r[6] > after_ns)  # fmt: skip

    def alive_since(self, host: str, after_ns: int) -> bool:
        """Return True once ``host`` announced itself alive in a document received after_ns."""
        return any(p["host"] == host and p["rx_ns"] > after_ns and p["doc"].get("alive")
                   for p in self.presence)  # fmt: skip

    def qpn(self, host: str) -> int | None:
        """Return the last announced QPN of ``host``'s NIC, None if not alive."""
        for p in reversed(self.presence):
            if p["host"] == host:
                doc = p["doc"]
                if not doc.get("alive") or not doc.get("rdma"):
                    return None
                return int(next(iter(doc["rdma"].values()))["qpn"])
        return None


def sniff(dev: str, obs: Observed) -> None:
    """Count (source address, UDP source port) of RoCEv2 packets seen on ``dev`` until stop."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))  # ETH_P_ALL:
    # a tap on one protocol (ETH_P_IP) sees only received frames, not the ones sent
    s.bind((dev, 0))
    s.settimeout(0.2)
    with s:
        while not obs.stop.is_set():
            try:
                pkt = s.recv(4096)
            except TimeoutError:
                continue
            if len(pkt) < 42 or pkt[12:14] != b"\x08\x00" or pkt[23] != 17:
                continue
            ihl = (pkt[14] & 0x0F) * 4
            sport, dport = struct.unpack_from("!HH", pkt, 14 + ihl)
            if dport == ROCE_PORT:
                src = socket.inet_ntoa(pkt[26:30])
                with obs.lock:
                    obs.wire.setdefault(src, Counter())[sport] += 1


async def subscribe(port: int, obs: Observed, ready: asyncio.Event) -> None:
    """Collect decoded probe records and presence documents until cancelled."""
    while True:
        try:
            async with aiomqtt.Client("127.0.0.1", port, identifier="rxe-scenario") as c:
                await c.subscribe(f"{PREFIX}/probes/+", qos=1)
                await c.subscribe(f"{PREFIX}/presence/+", qos=1)
                await c.subscribe(f"{PREFIX}/health/+", qos=1)
                ready.set()
                async for msg in c.messages:
                    _, kind, host = str(msg.topic).split("/")
                    payload = msg.payload if isinstance(msg.payload, bytes) else b""
                    now = time.time_ns()
                    if kind == "health":
                        obs.health.append({"host": host, "doc": json.loads(payload), "rx_ns": now})
                        continue
                    if kind == "presence":
                        doc = json.loads(payload) if payload else {}
                        obs.presence.append({"host": host, "doc": doc, "rx_ns": now})
                        continue
                    b = decode_batch(payload)
                    for i in range(len(b)):
                        obs.rows.append([b.origin, b.stamp, b.nic_ids[b.src[i]],
                                         b.nic_ids[b.dst[i]], int(b.sport[i]), int(b.seq[i]),
                                         int(b.t1[i]), int(b.t2[i]), int(b.t3[i]), int(b.t4[i]),
                                         bool(b.lost[i]), now])  # fmt: skip
        except aiomqtt.MqttError:
            await asyncio.sleep(0.2)


def sh(cmd: str) -> None:
    """Run one shell command in the guest; raise CalledProcessError with its output."""
    subprocess.run(["sh", "-c", cmd], check=True, capture_output=True, text=True)


class Scenario:
    """The processes of one run (broker, probers), each stopped by the PID it got."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.codes: dict[str, int | None] = {}
        self.runs: Counter[str] = Counter()

    def start_broker(self) -> int:
        port = 18830
        conf = self.out / "mosquitto.conf"
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        log = (self.out / "mosquitto.log").open("ab")
        self.procs["broker"] = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=log,
                                                stderr=log)  # fmt: skip
        return port

    def start_prober(self, host: str, config: str) -> None:
        self.runs[host] += 1
        path = self.out / f"{host}.toml"
        path.write_text(config)
        log = (self.out / f"{host}-{self.runs[host]}.log").open("ab")
        cmd = [sys.executable, "-m", "qpmesh.cli", "prober", "--config", str(path)]
        self.procs[host] = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=log)

    def stop(self, name: str, timeout_s: float = 60.0) -> int | None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        self.codes[f"{name}-{self.runs[name] or 1}"] = code
        return code

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


async def wait_for(cond: Any, timeout_s: float, what: str) -> float:
    """Poll ``cond()`` every 0.2 s; return the seconds it took; raise TimeoutError(what)."""
    began = time.monotonic()
    while not cond():
        if time.monotonic() - began > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        await asyncio.sleep(0.2)
    return time.monotonic() - began


def rdma_signals(pair: RxePair, reads: dict[str, list[int]]) -> dict[str, dict[str, float]]:
    """Return both rxe devices' counters as the prober's collector reads them (catalogue
    names, `prober.telemetry.rdma`); a device that cannot be read is left out. ``reads``
    gets, per device, the monotonic ns before and after its read (``signal_reads``: the two
    devices are read one after the other while probes flow, `read_skew_s`)."""
    out = {}
    for dev in (pair.rxe_a, pair.rxe_b):
        t0 = time.monotonic_ns()
        with contextlib.suppress(OSError):
            out[dev] = rdma_values(*read_rdma_port(dev, 1))
        reads[dev] = [t0, time.monotonic_ns()]
    return out


def read_skew_s(start: dict[str, list[int]], end: dict[str, list[int]], a: str, b: str) -> float:
    """Return the most by which the counting windows of devices ``a`` and ``b`` can differ
    (s): at each reading, the span from the first device's read beginning to the last one's
    ending, summed over the start and end readings. A counter of ``b`` may count this long
    more or less traffic than one of ``a`` over "the same" phase (0 when not recorded)."""
    total = 0
    for r in (start, end):
        if a in r and b in r:
            total += max(r[a][1], r[b][1]) - min(r[a][0], r[b][0])
    return total / 1e9


async def run(out: Path, phase_s: float) -> dict[str, Any]:
    """Run the three phases; return the observations (see the module docstring)."""
    pair = RxePair()
    res: dict[str, Any] = {"phases": {}, "waits": {}, "signals": {}, "signal_reads": {}}
    reads = res["signal_reads"]
    sh(setup_script(pair))
    res["rdma_link"] = subprocess.run(["rdma", "link", "show"], check=False, capture_output=True,
                                      text=True).stdout  # fmt: skip
    obs = Observed()
    sc = Scenario(out)
    sniffer = threading.Thread(target=sniff, args=(pair.veth_a, obs), daemon=True)
    sniffer.start()
    sub: asyncio.Task[None] | None = None
    cfg_a = prober_config("ha", "a0", pair.rxe_a, pair.addr_a, "b0", pair.addr_b, 18830)
    cfg_b = prober_config("hb", "b0", pair.rxe_b, pair.addr_b, "a0", pair.addr_a, 18830)
    try:
        sc.start_broker()
        ready = asyncio.Event()
        sub = asyncio.create_task(subscribe(18830, obs, ready))
        async with asyncio.timeout(60):
            await ready.wait()
        sc.start_prober("ha", cfg_a)
        sc.start_prober("hb", cfg_b)
        w = res["waits"]
        w["first_results"] = await wait_for(
            lambda: obs.results("a0", "b0") and obs.results("b0", "a0"), 420, "first results"
        )
        t = time.time_ns()
        res["signals"]["clean_start"] = rdma_signals(pair, reads.setdefault("clean_start", {}))
        await asyncio.sleep(phase_s)
        res["phases"]["clean"] = [t, time.time_ns()]
        res["signals"]["clean_end"] = rdma_signals(pair, reads.setdefault("clean_end", {}))

        qpn_a = obs.qpn("ha")
        assert qpn_a is not None
        home = rxe_sport_of_qpn(qpn_a)  # a0's announced QP: its replies to b0 leave from it
        sports = sorted({r[4] for r in obs.rows if r[2] == "a0" and r[4] != home})
        fault = sports[0]
        res["fault_sport"], res["home_sport_a0"] = fault, home
        dev = pair.veth_a
        t_add = time.time_ns()
        sh(f"tc qdisc add dev {dev} root handle 1: prio && "
           f"tc qdisc add dev {dev} parent 1:1 handle 10: netem loss 100% && "
           f"tc filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip protocol 17 0xff "
           f"match ip sport {fault} 0xffff flowid 1:1")  # fmt: skip
        t = time.time_ns()
        res["signals"]["fault_start"] = rdma_signals(pair, reads.setdefault("fault_start", {}))
        await asyncio.sleep(phase_s)
        t_end = time.time_ns()
        res["signals"]["fault_end"] = rdma_signals(pair, reads.setdefault("fault_end", {}))
        sh(f"tc qdisc del dev {dev} root")
        # [add begun, add done, delete begun, delete done]: surely faulty between the middle two
        res["phases"]["fault"] = [t_add, t, t_end, time.time_ns()]
        await asyncio.sleep(TIMEOUT_MS / 1000 + 1.5)  # the window's losses time out

        res["qpn_b_before"] = obs.qpn("hb")
        t_stop = time.time_ns()
        # in a thread: the subscriber keeps reading (and answering its keepalive) meanwhile
        await asyncio.to_thread(sc.stop, "hb")
        # a clean stop says alive=false; a stop that had to kill leaves it to the broker's
        # will (1.5 keepalives); an emulated guest on a busy host needs the margin
        res["waits"]["hb_gone"] = await wait_for(lambda: obs.qpn("hb") is None, 120, "hb gone")
        t_gone = time.time_ns()
        await asyncio.sleep(1.0)
        t_start = time.time_ns()
        sc.start_prober("hb", cfg_b)
        w["hb_back"] = await wait_for(lambda: obs.alive_since("hb", t_start), 300, "hb back")
        t_back = time.time_ns()
        w["relearnt"] = await wait_for(
            lambda: obs.results("a0", "b0", t_back) >= 5 and obs.results("b0", "a0", t_start),
            120, "results after restart")  # fmt: skip
        await asyncio.sleep(1.0)
        res["phases"]["restart"] = [t_stop, t_gone, t_start, t_back, time.time_ns()]
        res["qpn_b_after"] = obs.qpn("hb")
        res["qpn_a"] = qpn_a
        sc.stop("ha")
        sc.stop("hb")
        await asyncio.sleep(0.5)
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        sc.stop_all()
        obs.stop.set()
        if sub is not None:
            sub.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sub
    sniffer.join(timeout=5)
    # where a lost packet went, if one did: rxe's per-device counters and the links' drops
    res["counters"] = {
        name: subprocess.run(argv, check=False, capture_output=True, text=True).stdout
        for name, argv in (("rdma_statistic", ["rdma", "statistic", "show"]),
                           ("links", ["ip", "-s", "link", "show"]))
    }  # fmt: skip
    res["rows"] = obs.rows
    res["presence"] = obs.presence
    res["health"] = obs.health
    res["wire"] = {src: dict(c) for src, c in obs.wire.items()}
    res["exit_codes"] = sc.codes
    res["logs"] = {p.name: p.read_text(errors="replace")[-3000:] for p in sorted(out.glob("*.log"))}
    return res


def main(argv: list[str] | None = None) -> int:
    """Run the scenario; write ``--out``/result.json; return 0 (1 if the scenario failed)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="writable folder for result.json")
    ap.add_argument(
        "--phase-s", type=float, default=5.0, help="seconds of the clean and fault phases"
    )
    args = ap.parse_args(argv)
    began = time.monotonic()
    res = asyncio.run(run(args.out, args.phase_s))
    res["guest_seconds"] = time.monotonic() - began
    res["uptime_s"] = float(Path("/proc/uptime").read_text().split()[0])
    tmp = args.out / "result.json.tmp"
    tmp.write_text(json.dumps(res))
    os.replace(tmp, args.out / "result.json")
    return 1 if "error" in res else 0


if __name__ == "__main__":
    sys.exit(main())
