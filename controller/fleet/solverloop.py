"""The solver's shell on NATS JetStream: one active solver by lease, a standby that takes over.

`SolverLoop.run` (one connection's lifetime, reconnected through `mqttlink.reconnect`):

1. as standby, try the ``solver`` lease every lease tick (`natslink.lease`); the holder is
   the active solver, renews it, and stops solving the moment it may no longer use it;
2. on becoming active, read ``solved`` (the last window solved by any solver) from the
   clock bucket, make a fresh core, and read the partial stream from the time the
   first unsolved window's partials can appear (an ephemeral reader, no acks: the solver's
   place is ``solved``), reassemble commits (`controller.fleet.partials.Assembler`), merge
   them (``core.add``) and note them in a `WindowBook`;
3. solve each due window in order (complete: every partition committed; or past its
   deadline) in a thread, then put ``models`` and ``solved`` in the clock bucket (the
   workers watch ``models``) and hand the result to ``on_result`` (the service publishes
   its events on MQTT, feeds the API and the time series: `controller.service`).

With a learned fabric (``fabric_of``: the fabric the core solves on now, which the service's
learner replaces) the solver is the fleet's one learner: it publishes a version the bucket
does not hold as ``fabric`` (`controller.fleet.fabricwire`), with the traced paths mapped
onto it (``paths_of``), between fetches (workers with no fabric commit nothing, so no window
comes due) and before each solve, after reading the bucket's version when it became active;
models solved on a fabric go out only once that fabric is the published one, so a worker
knows them by revision.
With edge owners apart (``plane.edge_owners`` k >= 1, ``blocks``: the core's
`controller.fleet.cores.BlockSink`) their summary blocks come in the same stream
(`controller.fleet.ownerloop`); a solve window (``blocks.needs_blocks``) otherwise due waits
for all k blocks, at most ``plane.edge_wait_ns``: then it is judged without a clock solve
(counted in ``blocks_missing``), never solved on some of them. The blocks are heads
without their summary rows (`controller.fleet.stagelink`): the owners run the per-edge
stages of each solve window's rounds, the solver calls them on ``<prefix>.stage.<k>``
(core request/reply, ``edge_wait_s`` per call) from the solve's worker thread (with edge
owners the solve always runs in a thread); an owner that does not answer a call (gone,
refused: a new holder of the index that did not build the window) makes the window judged
without a clock solve (the core's ``missing_blocks``), never solved from some rounds.

A partial for a window already solved is late: counted (``late``) and dropped. A solver that
restarts (or a standby that takes over) starts from ``solved + 1``: the partials of the
windows since are still in the stream (its max age), so it is whole again within one window.

The reader is an ephemeral consumer, which the servers keep on one server (R1): when that
server dies the reader's fetches only time out, while the connection (to another server) and
the lease stay good. Every partition commits every window, so a reader that delivered nothing
for a whole window is taken as lost (`ReaderWatch`) and opened again just after the last
message it delivered (nothing skipped, nothing read twice: ``reopened`` counts it). Without
this a solver stops solving (no partials, no due windows) and holds its lease, so its standby
never takes over.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from controller.fleet.book import WindowBook
from controller.fleet.cores import BlockSink, SolverCore, SolveResultLike
from controller.fleet.edges import BlockError
from controller.fleet.fabricwire import (
    FABRIC_KEY,
    FabricPublisher,
    FabricWireError,
    encode_fabric,
)
from controller.fleet.partial import PartialError
from controller.fleet.partials import Assembler, PartialWireError
from controller.fleet.plane import MODELS_KEY, SOLVED_KEY, SOLVER_KEY, Plane
from controller.fleet.sessions import fleet_link, run_sessions
from controller.fleet.stagelink import StageLink, decode_head, nats_request, stage_subject
from controller.pathmap import PathRows
from mesh.fabric import Fabric
from mqttlink.reconnect import Backoff
from natslink.bigkv import ChunkedKV
from natslink.errors import LINK_ERRORS, NatsRefused, NatsUnavailable
from natslink.kvchunks import ChunkError
from natslink.lease import LeaseClock, Leases
from natslink.link import Link
from natslink.settings import NatsSettings
from natslink.streams import Delivery, Pull, open_reader

Log = Callable[..., None]
READ_WAIT_S = 0.25


@dataclass
class ReaderWatch:
    """When to open the partial reader again (pure; ``now_s`` monotonic seconds): after
    ``stall_s`` without a delivery. ``last_seq``: the last stream sequence delivered (None:
    nothing yet)."""

    stall_s: float
    since_s: float
    last_seq: int | None = None

    def delivered(self, seq: int, now_s: float) -> None:
        """Note a delivery of stream sequence ``seq`` at ``now_s``."""
        self.last_seq, self.since_s = seq, now_s

    def stalled(self, now_s: float) -> bool:
        """Return True (and start counting again) if nothing came for ``stall_s``."""
        if now_s - self.since_s < self.stall_s:
            return False
        self.since_s = now_s
        return True


class SolverLoop:
    """The solver ``solver_id``; ``make_core()`` gives the core each time it becomes
    active; ``on_result(window, result)`` gets every solve (on the loop). ``clock_ns``: UNIX
    ns (windows, deadlines); ``mono``: monotonic s (the lease); ``solve_in_thread``: solve in
    a worker thread (False: on the loop, for a core the loop's other tasks touch too);
    ``fabric_of``: with a learned fabric, the fabric the core solves on now (published to
    the workers, module doc); None: a declared fabric, which every process reads itself;
    ``paths_of(fabric)``: the traced paths mapped onto it, published with it (None: none);
    ``blocks``: where the edge owners' blocks go (with ``plane.edge_owners``); ``gate``:
    held for the whole of a solve run in a thread (`threaded`), so the loop's other users of
    a shared core (the service's host facts, snapshots, time series) wait for it, never
    touching the core from the loop while the thread judges (None: nothing to hold)."""

    def __init__(
        self,
        plane: Plane,
        settings: NatsSettings,
        solver_id: str,
        make_core: Callable[[], SolverCore],
        on_result: Callable[[int, SolveResultLike], object],
        *,
        log: Log,
        clock_ns: Callable[[], int] = time.time_ns,
        mono: Callable[[], float] = time.monotonic,
        solve_in_thread: bool = True,
        fabric_of: Callable[[], Fabric] | None = None,
        paths_of: Callable[[Fabric], PathRows] | None = None,
        blocks: BlockSink | None = None,
        gate: asyncio.Lock | None = None,
    ) -> None:
        self.plane, self.settings, self.solver_id = plane, settings, solver_id
        self.solve_in_thread = solve_in_thread
        self.make_core, self.on_result, self.log = make_core, on_result, log
        self.clock_ns, self.mono = clock_ns, mono
        self.lease = Leases(solver_id, LeaseClock(plane.lease_ttl_s), now=mono)
        self.active = False
        self.late = 0
        self.solves = 0
        self.takeovers = 0
        self.reopened = 0
        self.bad = 0  # partials the wire or the core refused
        self.book: WindowBook | None = None
        self.fabric_of, self.paths_of = fabric_of, paths_of
        self.publisher = FabricPublisher()
        self.blocks = blocks if plane.edge_owners else None
        self.blocks_missing = 0
        self.block_bytes = 0  # the owners' block heads as they came (no summary rows)
        self.stages: StageLink | None = None
        if self.blocks is not None:
            prefix = settings.subjects.prefix
            self.stages = StageLink(lambda k: stage_subject(prefix, k), plane.edge_wait_ns / 1e9)
            self.blocks.use_stages(self.stages.ranges)
        self._block_wait: dict[int, int] = {}  # solve window: since when it waits for blocks
        self.gate = gate

    @property
    def threaded(self) -> bool:
        """Return True when solves run in a worker thread: ``solve_in_thread``, or with edge
        owners (the rounds' stage calls are requests that need the loop)."""
        return self.solve_in_thread or self.stages is not None

    async def run(self, *, max_attempts: int | None = None) -> None:
        """Run until cancelled, reconnecting with backoff on link errors."""

        await run_sessions(self.settings, self._session, self.log, self.clock_ns,
                           max_attempts=max_attempts)  # fmt: skip

    async def _session(self, connected: Callable[[], None]) -> None:
        name = f"qpmesh-solver-{self.solver_id}"
        async with fleet_link(self.settings, self.plane, name, self.lease) as fl:
            link, clocks = fl.link, fl.clocks
            self.log(self.clock_ns(), "connected", server=link.server, solver=self.solver_id)
            connected()
            if self.stages is not None:
                self.stages.attach(asyncio.get_running_loop(), nats_request(link.nc))
            try:
                while True:
                    link.check()
                    if not await self.lease.claim(SOLVER_KEY):
                        self._standby()
                        await asyncio.sleep(self.lease.clock.renew_s / 2)
                        continue
                    await self._active(link, clocks)
            finally:
                if self.stages is not None:
                    self.stages.detach()
                self._standby()

    def _standby(self) -> None:
        if self.active:
            self.log(self.clock_ns(), "solver standby", solver=self.solver_id)
        self.active = False
        self.book = None

    async def _active(self, link: Link, clocks: ChunkedKV) -> None:
        """Solve while the lease holds; return when it is lost (raises link errors)."""
        self.active = True
        self.takeovers += 1
        self._block_wait = {}
        core = self.make_core()
        solved_entry = await clocks.bucket.get(SOLVED_KEY)
        solved = int(solved_entry.value) if solved_entry is not None else None
        book = self.book = WindowBook(self.plane, solved)
        first = solved + 1 if solved is not None else self.plane.closable(self.clock_ns()) - 1
        # partials of window w are sent from its end + grace on: read from one window before
        start_ns = self.plane.window_end(first) - self.plane.window_ns
        reader = await self._open_reader(link, start_ns)
        self.log(self.clock_ns(), "solver active", solver=self.solver_id, from_window=first)
        await self._fabric_seen(clocks)
        asm, basm = Assembler(), Assembler()
        watch = ReaderWatch(self.plane.window_ns / 1e9, self.mono())
        try:
            while True:
                await self.lease.renew()
                if not self.lease.valid(SOLVER_KEY):
                    return
                await self._publish_fabric(clocks)  # workers wait for it: not only at solves
                got = await reader.fetch(self.plane.fetch_batch, READ_WAIT_S)
                if got:
                    watch.delivered(got[-1].stream_seq, self.mono())
                elif watch.stalled(self.mono()):
                    reader = await self._reopen(link, reader, watch.last_seq, start_ns)
                for d in got:
                    if self.blocks is not None and self.settings.subjects.is_block(d.subject):
                        self._block(basm, d.headers, d.data)
                    else:
                        self._take(core, book, asm, d)
                for w in book.due(self.clock_ns()):
                    if not self.lease.valid(SOLVER_KEY):
                        return  # never publish for a lease no longer ours
                    if not self._blocks_ready(w):
                        break
                    await self._solve(core, clocks, book, w)
        finally:
            with contextlib.suppress(*LINK_ERRORS):
                await reader.close()

    async def _open_reader(
        self, link: Link, start_ns: int, start_seq: int | None = None
    ) -> Pull:  # fmt: skip
        """Open the partial reader just after ``start_seq - 1`` (or at ``start_ns``). Its
        ephemeral consumer lives on one server, which for a while after a server died can be
        the dead one (the request then times out): tried again after the project's backoff
        (`mqttlink.reconnect.Backoff`, ``[nats]``'s bounds) while the lease holds, instead of
        giving the lease up with the connection. Raises `NatsUnavailable` when the lease is
        gone or the connection lost."""
        subject = self.settings.subjects.partials_all()
        backoff = Backoff(self.settings.backoff_min_s, self.settings.backoff_max_s, jitter=0.2)
        while True:
            try:
                if start_seq is not None:
                    return await open_reader(link, self.plane.partial_stream, subject, start_seq)
                return await open_reader(link, self.plane.partial_stream, subject,
                                         start_ns=start_ns)  # fmt: skip
            except NatsUnavailable as exc:
                link.check()
                await self.lease.renew()
                if not self.lease.valid(SOLVER_KEY):
                    raise
                delay = backoff.next_delay()
                self.log(self.clock_ns(), "partial reader failed", solver=self.solver_id,
                         error=str(exc), retry_in_s=round(delay, 3))  # fmt: skip
                await asyncio.sleep(delay)

    async def _reopen(self, link: Link, old: Pull, last_seq: int | None, start_ns: int) -> Pull:
        """Open the partial reader again just after ``last_seq`` (or at ``start_ns``); its
        creation is retried as the first one's is (`_open_reader`)."""
        with contextlib.suppress(*LINK_ERRORS):
            await old.close()
        start_seq = last_seq + 1 if last_seq is not None else None
        reader = await self._open_reader(link, start_ns, start_seq)
        self.reopened += 1
        self.log(self.clock_ns(), "partial reader reopened", solver=self.solver_id,
                 from_seq=start_seq)  # fmt: skip
        return reader

    # ---- a learned fabric ----------------------------------------------------------------

    async def _fabric_seen(self, clocks: ChunkedKV) -> None:
        """On becoming active: note the bucket's fabric version (a predecessor's), so only
        another one is published."""
        self.publisher = FabricPublisher()
        if self.fabric_of is None:
            return
        try:
            entry = await clocks.get(FABRIC_KEY)
            if entry is not None:
                self.publisher.seen(entry.value)
        except (FabricWireError, ChunkError) as exc:  # not ours to read: ours replaces it
            self.log(self.clock_ns(), "bad fabric version", error=str(exc))

    async def _publish_fabric(self, clocks: ChunkedKV) -> None:
        """Publish the fabric the core solves on if the bucket does not hold it."""
        if self.fabric_of is None:
            return
        fabric = self.fabric_of()
        if not self.publisher.due(fabric):
            return
        data = encode_fabric(fabric, self.paths_of(fabric) if self.paths_of else None)
        try:
            revision = await clocks.put(FABRIC_KEY, data)
        except NatsRefused as exc:  # refused (the bucket's limits): the workers keep theirs
            self.publisher.refused(fabric)
            self.log(self.clock_ns(), "fabric refused", error=str(exc), bytes=len(data))
            return
        self.publisher.published(fabric)
        self.log(self.clock_ns(), "fabric published", fabric=self.publisher.id,
                 nics=len(fabric.nics), links=len(fabric.links), revision=revision,
                 bytes=len(data))  # fmt: skip

    def _models_current(self) -> bool:
        """Return True when models solved now belong to the published fabric."""
        return self.fabric_of is None or self.publisher.current(self.fabric_of())

    def _take(self, core: SolverCore, book: WindowBook, asm: Assembler, d: Delivery) -> None:
        """Take one message of a worker's partial (a chunk or its commit): a committed one
        goes to the core unless its window was solved (``late``); one the wire or the core
        refuses (malformed, another grid; one of another fabric is the core's ``stale``) is
        logged and counted in ``bad``, its window's partition taken as committed (its worker
        will not send it again)."""
        try:
            c = asm.feed(d.headers, d.data)
            if c is None:
                return
            if not book.add(c.window, c.partition, d.stored_ns):
                self.late += 1
                self.log(self.clock_ns(), "late partial", window=c.window,
                         partition=c.partition, worker=c.worker)  # fmt: skip
                return
            if c.body:
                core.add(c.body)
        except (PartialWireError, PartialError) as exc:
            self.bad += 1
            self.log(self.clock_ns(), "bad partial", seq=d.stream_seq, error=str(exc))

    def _block(self, basm: Assembler, headers: Mapping[str, str], data: bytes) -> None:
        """Take one message of an edge owner's block head (a chunk or its commit)."""
        assert self.blocks is not None and self.stages is not None
        try:
            c = basm.feed(headers, data)
            if c is not None:
                self.block_bytes += len(c.body)
                block, edges, points = decode_head(c.body)
                self.stages.note(block, edges, points)
                self.blocks.add_block(block.encode())
        except (PartialWireError, BlockError, ValueError) as exc:
            self.log(self.clock_ns(), "bad summary block", error=str(exc))

    def _blocks_ready(self, w: int) -> bool:
        """Return True when window ``w`` may be solved: no blocks needed, all in, or waited
        for ``edge_wait_ns`` (then counted in ``blocks_missing``: judged without a clock
        solve)."""
        if self.blocks is None or not self.blocks.needs_blocks(w):
            return True
        have = self.blocks.blocks_in(w)
        if have >= self.plane.edge_owners:
            self._block_wait.pop(w, None)
            return True
        now = self.clock_ns()
        since = self._block_wait.setdefault(w, now)
        if now - since < self.plane.edge_wait_ns:
            return False
        del self._block_wait[w]
        self.blocks_missing += 1
        self.log(now, "summary blocks missing", window=w, have=have,
                 owners=self.plane.edge_owners)  # fmt: skip
        return True

    async def _in_thread(self, core: SolverCore, w: int, now: int) -> SolveResultLike:
        """Return ``core.solve(w, now)`` run in a worker thread, renewing the lease meanwhile
        (a stage call to an owner killed while it held the call waits ``edge_wait_s``, longer
        than the lease's TTL). Returns only once the thread did, also when cancelled or when a
        renewal raises (the core is the thread's until then); raises what the solve raised."""
        job = asyncio.ensure_future(asyncio.to_thread(core.solve, w, now))
        try:
            while not job.done():
                await asyncio.wait({job}, timeout=self.lease.clock.renew_s / 2)
                if not job.done():
                    await self.lease.renew()
        finally:
            if not job.done():
                await asyncio.wait({job})
        return job.result()

    async def _solve(self, core: SolverCore, clocks: ChunkedKV, book: WindowBook, w: int) -> None:
        missing = self.plane.partitions - len(book.pending.get(w, ()))
        await self._publish_fabric(clocks)
        now = self.clock_ns()
        if self.threaded:  # the rounds' calls wait on the loop
            async with self.gate if self.gate is not None else contextlib.nullcontext():
                result = await self._in_thread(core, w, now)
            if not self.lease.valid(SOLVER_KEY):
                return  # lost while it solved: never publish for a lease no longer ours
        else:  # the core is shared with the loop's other users (the service's host facts)
            result = core.solve(w, now)
        book.mark_solved(w)
        self.solves += 1
        if result.clock and self._models_current():
            await clocks.put(MODELS_KEY, result.clock)
        await clocks.bucket.put(SOLVED_KEY, str(w).encode())  # small: one plain value
        self.log(self.clock_ns(), "window solved", window=w, missing_partitions=missing,
                 events=len(result.events))  # fmt: skip
        self.on_result(w, result)


__all__ = ["ReaderWatch", "SolverLoop"]
