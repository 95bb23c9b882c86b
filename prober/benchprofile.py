"""Where the CPU of a full probe round trip goes: `profile_round_trips`, for ``qpmesh prober
bench --profile``.

Two measurements of the loopback round-trip loop of `prober.benchloop` (both roles in one
process):

1. without a profiler: ``getrusage`` user and system time per round trip (system time is the
   kernel's UDP/IP work on both ends, stamping and the system calls themselves);
2. the same loop under `cProfile`: each function's own time (``tottime``) is put in a stage
   (`STAGES`, by function name); the socket calls' own time is kernel time seen from Python.

The stage table splits the *unprofiled* user time by the Python stages' shares of the
profiled Python time, and reports the unprofiled system time as one "kernel" stage (the
socket calls' share under the profiler is given too, as a cross-check). The profiler inflates
many small Python calls more than a few big ones: shares are approximate.
"""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import resource

from prober.benchloop import endpoint_round_trips

STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("socket calls (sendto/recvmsg/sendmmsg/recvmmsg)",
     ("sendto", "recvmsg", "recvmsg_into", "setsockopt")),
    ("control messages: stamps, extended errors, addresses",
     ("parse_stamp", "parse_extended_err", "stamp", "tx_stamp", "cmsgs", "received", "source",
      "payload", "length", "_sockaddr")),
    ("wire decode + Message validation", ("decode", "__new__", "_make", "unpack_from")),
    ("wire encode", ("encode", "pack", "pack_into")),
    ("batched socket calls: ctypes recvmmsg/sendmmsg + ring buffers", ("recv", "send")),
    ("session: probes out (queue, heap, pending, deadlines)",
     ("queue_probe", "next_datagrams", "_make_probe", "__lt__", "heappush", "heappop",
      "next_deadline_ns")),
    ("session: matching replies, answering, TX stamps, results",
     ("receive", "receive_many", "_answer", "_answer_fast", "on_tx_stamp", "on_tx_stamps",
      "_maybe_complete", "__post_init__", "_check_path", "__init__")),
    ("compiled engine (C: recvmmsg, parsing, matching, sendmmsg, error queues; its system "
     "calls' kernel time is in the kernel row)",
     ("drain", "send_due", "queue", "take", "feed", "take_counters", "note_sent")),
    ("endpoint glue (readiness callbacks, send, flush, clock)",
     ("_on_readable", "_drain_errqueue", "flush", "_send_group", "now_ns", "identity_clock",
      "_deliver", "count", "_scheduled_flush", "_schedule_flush", "wants_tx_stamp",
      "_after_engine", "queue_probe", "take_events", "_dst", "frombuffer", "reshape")),
)  # fmt: skip
_SOCKET_CALLS = STAGES[0][1]


def _name(func: str) -> str:
    """Return the bare name of a pstats function label (``<method 'recvmsg' of ...>`` ->
    ``recvmsg``, ``<built-in method time.time_ns>`` -> ``time_ns``)."""
    if func.startswith("<method '"):
        return func.split("'")[1]
    if func.startswith("<built-in method "):
        return func[len("<built-in method ") :].split(" ", maxsplit=1)[0].rstrip(">").split(".")[-1]
    return func.rsplit(".", maxsplit=1)[-1]


def _stage_of(func: str) -> str:
    for stage, names in STAGES:
        if func in names:
            return stage
    return "other (event loop, builtins, bench driver)"


def profile_round_trips(seconds: float = 2.0, path: str = "per-datagram") -> dict[str, object]:
    """Profile the round-trip loop of ``path`` for ``seconds`` and return the stage table.

    Returns ``cpu_us_per_round_trip`` (unprofiled user + system), ``user_us``, ``system_us``
    and ``stages``: [{stage, us, share}] summing to the unprofiled CPU per round trip.
    Raises `ValueError` for a non-positive ``seconds`` or an unknown path.
    """
    if seconds <= 0:
        raise ValueError("seconds must be positive")
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    done, _, _ = asyncio.run(endpoint_round_trips(seconds, path))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    done = max(done, 1)
    user_us = (r1.ru_utime - r0.ru_utime) / done * 1e6
    sys_us = (r1.ru_stime - r0.ru_stime) / done * 1e6
    prof = cProfile.Profile()
    prof.enable()
    asyncio.run(endpoint_round_trips(seconds, path))
    prof.disable()
    stats = pstats.Stats(prof)
    own: dict[str, float] = {}
    for (_, _, func), row in stats.stats.items():  # type: ignore[attr-defined]
        stage = _stage_of(_name(func))
        own[stage] = own.get(stage, 0.0) + float(row[2])
    socket_s = own.pop(_stage_of(_SOCKET_CALLS[0]), 0.0)
    python_s = sum(own.values()) or 1.0
    total_profiled = python_s + socket_s
    rows = [("kernel: UDP/IP on both ends, stamping, system calls (system time)", sys_us)]
    for stage, _ in (*STAGES[1:], ("other (event loop, builtins, bench driver)", ())):
        rows.append((stage, user_us * own.get(stage, 0.0) / python_s))
    total = user_us + sys_us
    stages = [
        {"stage": stage, "us": round(us, 2), "share": round(us / total, 3) if total else 0.0}
        for stage, us in rows
    ]
    return {
        "path": path,
        "round_trips": done,
        "cpu_us_per_round_trip": round(total, 2),
        "user_us": round(user_us, 2),
        "system_us": round(sys_us, 2),
        "socket_calls_share_under_profiler": round(socket_s / total_profiled, 3),
        "stages": stages,
    }
