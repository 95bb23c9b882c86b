"""Prober throughput benchmark: timestamped probes per second on one core, on loopback.

One thread sends PROBE datagrams (``Codec.pack_probe_into`` into a preallocated buffer,
non-blocking ``sendto``) in batches from one UDP socket to another on 127.0.0.1, then drains the
receiver (``recvmsg_into`` with its SCM_TIMESTAMPING RX stamp) and the sender's error queue (the
TX stamps, ``MSG_ERRQUEUE``). A probe counts when both its TX and RX stamps were read.

The baseline is the same loop with timestamping off (plain ``recv_into``, no error queue), run
in the same process, interleaved round by round with the timestamped loop so machine noise
hits both alike; figures are medians over rounds. ``timestamp_overhead_ratio`` =
baseline / timestamped (1.0: free; 2.0: timestamping halves the rate).

``session_probes_per_second`` is a separate figure: complete probes per second through two
`ProbeSession` objects (encode, decode, matching; initiator and responder work both counted, no
sockets), i.e. the protocol's own CPU ceiling. ``endpoint_probes_per_second``: complete
probes per second through the whole stack (two `prober.udp.UdpEndpoint` on loopback in one
asyncio loop, kernel stamps, follow-ups), i.e. what one prober process actually sustains.

CLI hooks: ``bench_figures(seconds, path=..., repeats=..., profile=...) -> dict[str, object]``
and ``show_figures(result)`` (a short text summary); ``run_bench(seconds, json)`` does both
(one JSON object with ``json=True``).
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import socket
import statistics
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any

from prober.benchloop import PATHS, endpoint_round_trips
from prober.timestamping import ANC_BUFSIZE, SO_TIMESTAMPING, SW_FLAGS
from prober.wire import Codec, nic_hash

_BATCH = 32
_ROUNDS = 6
_SOL_SOCKET = socket.SOL_SOCKET
_SCM = SO_TIMESTAMPING
_TS = struct.Struct("=qq")


def _pair(stamped: bool) -> tuple[socket.socket, socket.socket]:
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for s in (tx, rx):
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        s.setsockopt(_SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        if stamped:
            s.setsockopt(_SOL_SOCKET, SO_TIMESTAMPING, SW_FLAGS)
    return tx, rx


def _stamp_ns(anc: list[tuple[int, int, bytes]]) -> int:
    for level, kind, data in anc:
        if kind == _SCM and level == _SOL_SOCKET:
            sec, nsec = _TS.unpack_from(data)
            return int(sec) * 1_000_000_000 + int(nsec)
    return 0


def _run_loop(stamped: bool, seconds: float, clock: Callable[[], float]) -> float:
    """Return probes/s (with both stamps when ``stamped``) for a loop of ``seconds``."""
    tx, rx = _pair(stamped)
    try:
        dest = rx.getsockname()
        codec = Codec()
        buf = bytearray(64)
        view = memoryview(buf)[:48]
        rbuf = bytearray(2048)
        src, dst = nic_hash("bench-a"), nic_hash("bench-b")
        sendto, pack = tx.sendto, codec.pack_probe_into
        recv_into, recvmsg_into, recvmsg = rx.recv_into, rx.recvmsg_into, tx.recvmsg
        errq = socket.MSG_ERRQUEUE
        seq = 0
        n_tx = n_rx = 0
        start = clock()
        end = start + seconds
        while clock() < end:
            for _ in range(_BATCH):
                pack(buf, src, dst, seq & 0xFFFFFFFF)
                seq += 1
                try:
                    sendto(view, dest)
                except BlockingIOError:
                    break
            if stamped:
                while True:
                    try:
                        _, anc, _, _ = recvmsg_into([rbuf], ANC_BUFSIZE)
                    except BlockingIOError:
                        break
                    if _stamp_ns(anc):
                        n_rx += 1
                while True:
                    try:
                        _, anc, _, _ = recvmsg(0, ANC_BUFSIZE, errq)
                    except BlockingIOError:
                        break
                    if _stamp_ns(anc):
                        n_tx += 1
            else:
                while True:
                    try:
                        recv_into(rbuf)
                    except BlockingIOError:
                        break
                    n_rx += 1
                n_tx = n_rx
        elapsed = clock() - start
        return min(n_tx, n_rx) / elapsed
    finally:
        tx.close()
        rx.close()


def _session_rate(seconds: float, clock: Callable[[], float]) -> float:
    """Return complete probes/s through two `ProbeSession` objects (all protocol work, no I/O)."""
    from prober.session import ProbeSession

    a, b = ProbeSession("bench-a", timeout_ns=10**12), ProbeSession("bench-b", timeout_ns=10**12)
    dest, now, done = ("127.0.0.1", 4791), 0, 0
    start = clock()
    end = start + seconds
    while clock() < end:
        for _ in range(_BATCH):
            now += 1000
            a.queue_probe("bench-b", dest, 50000, now)
            (probe,) = a.next_datagrams(now)
            a.on_tx_stamp(probe.meta.token, now)
            b.receive(probe.data, ("127.0.0.1", 50000), now + 10, now + 10)
            (reply,) = b.next_datagrams(now + 10)
            b.on_tx_stamp(reply.meta.token, now + 11)
            (follow,) = b.next_datagrams(now + 12)
            a.receive(reply.data, dest, now + 20, now + 20)
            done += len(a.receive(follow.data, dest, now + 21, now + 21))
    return done / (clock() - start)


async def _endpoint_rate(seconds: float) -> float:
    """Return complete probes/s (wall clock) through two per-datagram endpoints on loopback."""
    done, _, elapsed = await endpoint_round_trips(seconds, "per-datagram")
    return done / elapsed


def measure_round_trips(
    seconds: float = 1.0, repeats: int = 3, paths: tuple[str, ...] = PATHS
) -> dict[str, object]:
    """Return full round trips per CPU second for each path, interleaved repeat by repeat.

    ``round_trips_per_core_second`` is the fastest path this install runs (``path``: compiled
    when `prober._fastpath` is built, else batched), ``baseline_round_trips_per_core_second``
    the per-datagram path, both medians over ``repeats``; ``round_trip_ratio`` = the first /
    the baseline; every path measured also has ``<path>_round_trips_per_core_second`` and its
    per-repeat values. With probe HMAC on (the ``-auth`` paths, `prober.benchloop.AUTH_KEY`):
    ``auth_round_trip_ratio`` = compiled-auth / per-datagram-auth (what an authenticated
    prober gains from the compiled path) and ``auth_cost_compiled`` = compiled /
    compiled-auth (what turning authentication on costs it). Raises `ValueError` for
    non-positive ``seconds``/``repeats`` or an unknown path.
    """
    if seconds <= 0 or repeats <= 0:
        raise ValueError("seconds and repeats must be positive")
    runs: dict[str, list[float]] = {p: [] for p in paths}
    for _ in range(repeats):
        for p in paths:
            done, cpu, _ = asyncio.run(endpoint_round_trips(seconds, p))
            runs[p].append(done / cpu if cpu > 0 else 0.0)
    out: dict[str, object] = {"repeats": repeats, "seconds_per_run": seconds}
    med = {p: statistics.median(v) for p, v in runs.items()}
    for p in paths:
        key = p.replace("-", "_")
        out[f"{key}_round_trips_per_core_second"] = round(med[p])
        out[f"{key}_per_repeat"] = [round(x) for x in runs[p]]
    best = next((p for p in ("compiled", "batched") if p in med), None)
    if best is not None:
        out["path"] = best
        out["round_trips_per_core_second"] = round(med[best])
        out["cpu_us_per_round_trip"] = round(1e6 / med[best], 2) if med[best] else None
        out["per_repeat_round_trips_per_core_second"] = [round(x) for x in runs[best]]
    if "per-datagram" in med:
        base = med["per-datagram"]
        out["baseline_round_trips_per_core_second"] = round(base)
        out["baseline_cpu_us_per_round_trip"] = round(1e6 / base, 2) if base else None
        out["per_repeat_baseline"] = [round(x) for x in runs["per-datagram"]]
        if best is not None and base:
            out["round_trip_ratio"] = round(med[best] / base, 3)
    if med.get("compiled-auth") and med.get("per-datagram-auth"):
        out["auth_round_trip_ratio"] = round(med["compiled-auth"] / med["per-datagram-auth"], 3)
    if med.get("compiled-auth") and med.get("compiled"):
        out["auth_cost_compiled"] = round(med["compiled"] / med["compiled-auth"], 3)
    return out


def measure(
    seconds: float = 5.0, rounds: int = _ROUNDS, path: str = "both", repeats: int = 3
) -> dict[str, object]:
    """Run the interleaved benchmark for about ``seconds`` and return the figures.

    Adds the full round trips per CPU second of ``path`` ("both": every path this install
    runs, compiled, batched and the per-datagram baseline, and compiled and per-datagram with
    probe HMAC on, interleaved; see `measure_round_trips`).
    Raises `ValueError` for non-positive ``seconds``, ``rounds`` or ``repeats``.
    """
    if seconds <= 0 or rounds <= 0 or repeats <= 0:
        raise ValueError("seconds, rounds and repeats must be positive")
    per = seconds / (2 * rounds)
    clock = time.perf_counter
    _run_loop(True, min(per, 0.1), clock)  # warm-up: lets the kernel switch RX stamping on
    stamped: list[float] = []
    plain: list[float] = []
    for _ in range(rounds):
        stamped.append(_run_loop(True, per, clock))
        plain.append(_run_loop(False, per, clock))
    pps, base = statistics.median(stamped), statistics.median(plain)
    session = _session_rate(min(per, 1.0), clock)
    endpoint = asyncio.run(_endpoint_rate(min(per, 1.0)))
    paths = PATHS if path == "both" else (path,)
    round_trips = measure_round_trips(max(0.5, seconds / repeats / 2), repeats, paths)
    return {
        "probes_per_second": round(pps),
        "baseline_probes_per_second": round(base),
        "timestamp_overhead_ratio": round(base / pps, 3) if pps else None,
        "rounds": rounds,
        "seconds": seconds,
        "batch": _BATCH,
        "stamp": "sw",
        "session_probes_per_second": round(session),
        "endpoint_probes_per_second": round(endpoint),
        "per_round_probes_per_second": [round(x) for x in stamped],
        "per_round_baseline": [round(x) for x in plain],
        **round_trips,
    }


def run_bench(
    seconds: float = 5.0,
    json: bool = False,
    *,
    path: str = "both",
    repeats: int = 3,
    profile: bool = False,
) -> dict[str, object]:
    """Measure (`bench_figures`), print (one JSON object if ``json`` else `show_figures`),
    and return the figures."""
    result = bench_figures(seconds, path=path, repeats=repeats, profile=profile)
    if json:
        print(jsonlib.dumps(result))
    else:
        show_figures(result)
    return result


def bench_figures(
    seconds: float = 5.0, *, path: str = "both", repeats: int = 3, profile: bool = False
) -> dict[str, object]:
    """Return the figures of `measure` or, with ``profile``,
    `prober.benchprofile.profile_round_trips` of ``path`` ("both" profiles the per-datagram
    path)."""
    if profile:
        from prober.benchprofile import profile_round_trips

        return profile_round_trips(seconds, "per-datagram" if path == "both" else path)
    return measure(seconds, path=path, repeats=repeats)


def show_figures(result: Mapping[str, Any]) -> None:
    """Print a short text summary of `bench_figures`."""
    if "stages" in result:  # a profile
        print(f"{result['path']}: {result['cpu_us_per_round_trip']} us CPU per round trip")
        for row in result["stages"]:
            print(f"  {row['us']:8.2f} us  {100 * row['share']:5.1f} %  {row['stage']}")
        return
    print(
        f"timestamped probes/s: {result['probes_per_second']}  "
        f"baseline: {result['baseline_probes_per_second']}  "
        f"overhead ratio: {result['timestamp_overhead_ratio']}"
    )
    if "round_trips_per_core_second" in result:
        print(
            f"{result['path']} round trips per core-second: {result['round_trips_per_core_second']}"
        )
    if "baseline_round_trips_per_core_second" in result:
        print(
            "per-datagram round trips per core-second: "
            f"{result['baseline_round_trips_per_core_second']}"
        )
    if "round_trip_ratio" in result:
        print(f"ratio: {result['round_trip_ratio']}")
    for p in ("compiled-auth", "per-datagram-auth"):
        key = f"{p.replace('-', '_')}_round_trips_per_core_second"
        if key in result:
            print(f"{p} round trips per core-second: {result[key]}")
    if "auth_round_trip_ratio" in result:
        print(f"ratio with probe HMAC (compiled-auth / per-datagram-auth): "
              f"{result['auth_round_trip_ratio']}")  # fmt: skip


if __name__ == "__main__":  # pragma: no cover
    run_bench(5.0, json=True)
