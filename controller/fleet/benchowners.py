"""Edge owners as processes of their own, for the clock bench (`controller.fleet.bench`): so
the solver's figures are the solver's alone.

With the owners' stages in the bench's one process, the solver's peak memory counted every
owner's summary (at 100,000 NICs four blocks of 6.4 M rows' hulls) and its CPU left out the
bytes of the rounds. Here each owner is a child process (spawned: a forked one would share
the caller's heap, ~13 GB after the detection stage at 100,000 NICs, and four of them ran the
machine out of memory) (`OwnerProcs`) that summarizes its
rows of the clock window (`controller.clocksolve.window_summary`), holds the
`sync.edgestage.EdgeRange` and answers the staged solve's calls over a pipe as
`controller.fleet.stagewire.StageServer` frames; the solver's side is one
`controller.fleet.stagewire.RemoteRange` per owner, so the solve runs on the same bytes a
fleet would carry, and what the solver process spends (the network stages, encoding the calls,
decoding the replies) and the memory it reaches are measured in that process alone. Each
child reports its own CPU per call and its peak resident set. A thin shell: processes and
pipes; the cores it drives are pure.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing as mp
import resource
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from controller.clocksolve import SampleRows, SampleWindow, window_summary
from controller.fleet.edges import SummaryBlock
from controller.fleet.stagewire import RemoteRange, StageServer
from sync.edgestage import EdgeRange, FitParams

I64 = npt.NDArray[np.int64]
DONE = b"done"


def hwm_mb() -> float:
    """The process's peak resident set since the last `reset_peak` (VmHWM, MiB); its peak
    since it started (``getrusage``) where /proc cannot say."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def release_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc ``malloc_trim``), so what a
    stage freed does not count in the next one's resident set; best effort."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def reset_peak() -> None:
    """Reset the process's peak resident set (Linux ``/proc/self/clear_refs`` 5); best effort."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _owner(conn: Connection, owner: int, t_ref: int, tol_ns: int, params: FitParams) -> None:
    """A child: take its rows from the pipe, summarize them, say so (its edges, CPU, block
    bytes), answer stage calls until `DONE`, then send its calls' CPU and bytes and its peak
    resident set."""
    rows: SampleRows = conn.recv()
    reset_peak()
    t0 = time.process_time()
    summ = window_summary(SampleWindow(**rows.cols()), t_ref, tol_ns)
    summary_cpu = time.process_time() - t0
    n_rows = len(rows)
    del rows
    t0 = time.process_time()
    block = SummaryBlock(owner, 0, n_rows, 0, 0, False, summ, np.zeros((0, 2), np.int64),
                         np.zeros(0))  # fmt: skip
    size = len(block.encode())
    encode_cpu = time.process_time() - t0
    del block
    rng = EdgeRange(summ, params)
    server = StageServer(0, rng)
    conn.send({"edges": rng.edges, "rows": n_rows, "points": summ.n_points,
               "summary_cpu_s": summary_cpu, "block_bytes": size,
               "encode_cpu_s": encode_cpu})  # fmt: skip
    calls: list[tuple[float, int]] = []
    while (data := conn.recv_bytes()) != DONE:
        t0 = time.process_time()
        reply = server.answer(data)
        calls.append((time.process_time() - t0, len(reply)))
        conn.send_bytes(reply)
    conn.send({"calls": calls, "peak_rss_mb": hwm_mb()})
    conn.close()


class OwnerProcs:
    """K owner processes, one per piece of the clock window's rows (`split_clock` order);
    ``pieces`` is emptied once every child has its copy, so the caller's process holds no
    rows. Use as a context manager: the children are stopped on the way out, also on
    failure. Raises RuntimeError when a child dies before it answered."""

    def __init__(self, pieces: list[SampleRows], t_ref: int, tol_ns: int, params: FitParams):
        ctx = mp.get_context("spawn")  # fresh processes: a fork would share the caller's heap
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        k = len(pieces)
        for o in range(k):
            here, there = ctx.Pipe()
            p = ctx.Process(target=_owner, args=(there, o, t_ref, tol_ns, params), daemon=True)
            p.start()
            there.close()
            self._conns.append(here)
            self._procs.append(p)
        for o in range(k):
            self._conns[o].send(pieces[o])
        pieces.clear()  # sent: the caller's process keeps none of the rows
        release_heap()
        self.hello: list[dict[str, Any]] = [self._recv(o) for o in range(k)]

    def __enter__(self) -> OwnerProcs:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self._procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=30)

    @property
    def pids(self) -> list[int]:
        """The owner processes' ids, in owner order."""
        return [int(p.pid) for p in self._procs]

    def running(self) -> int:
        """How many owner processes are alive."""
        return sum(1 for p in self._procs if p.is_alive())

    def _recv(self, o: int) -> dict[str, Any]:
        try:
            got: dict[str, Any] = self._conns[o].recv()
        except (EOFError, OSError) as e:
            raise RuntimeError(f"edge owner {o} died (exit {self._procs[o].exitcode})") from e
        return got

    def ranges(self) -> list[RemoteRange]:
        """The solver's side of each owner: a `RemoteRange` over its pipe."""

        def sender(conn: Connection) -> Any:
            def send(data: bytes) -> bytes:
                conn.send_bytes(data)
                return conn.recv_bytes()

            return send

        return [RemoteRange(0, h["edges"], sender(c)) for h, c in zip(self.hello, self._conns,
                                                                        strict=True)]  # fmt: skip

    def finish(self) -> list[dict[str, Any]]:
        """End every child; returns per owner its calls ((CPU s, reply bytes) each, in order)
        and its peak resident set (MiB). Raises RuntimeError when one died."""
        for o, c in enumerate(self._conns):
            try:
                c.send_bytes(DONE)
            except OSError as e:
                raise RuntimeError(f"edge owner {o} died (exit {self._procs[o].exitcode})") from e
        out = [self._recv(o) for o in range(len(self._conns))]
        for p in self._procs:
            p.join(timeout=60)
        return out
