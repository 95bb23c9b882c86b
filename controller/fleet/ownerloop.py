"""``qpmesh controller owner``: an edge owner process's shell on NATS JetStream.

With ``[fleet] edge_owners = K`` the clock work per edge (folding each window's kept pairs,
reducing a solve window's rows to a summary: `controller.fleet.edges`) runs in K owner
indices instead of the solver. Any number of owner processes share them through leases, as
workers share partitions. One connection's lifetime (`OwnerLoop.run` reconnects through
the project's one loop, `mqttlink.reconnect`, with ``[nats]``'s backoff):

1. set up the partial stream and the buckets of the `Plane` (idempotent);
2. every lease tick: renew the ``edge.<k>`` leases held (`natslink.lease.Leases`), register
   this process (``owner.<id>``, same TTL), claim free indices up to a fair share,
   ``ceil(K / live owner processes)``, give back those above it. An index lost stops at
   once (its task cancelled, nothing of it published);
3. per held index a task: a fresh `controller.fleet.owner.OwnerCore` told the last window the
   solver solved (``solved`` in the clock bucket: solve windows up to it are folded, not
   summarized) and the fleet's first coded send (in ``models``: where the warm-up bins are,
   also when the stream no longer holds the first clock rows), an ephemeral reader of the
   index's shares in the partial stream (``<prefix>.partials.c<k>.*``: each worker cuts its
   partials into one share per index, `controller.fleet.ownershare`; an owner decodes its
   own alone, not every whole partial) **from its first message kept** (the owner's state is
   the selection of every window's pairs, with floor memory over past clock windows: rebuilt
   exactly by replaying what the stream keeps, `Plane.max_age_s`). Committed shares
   (`controller.fleet.partials.Assembler`; a window with no partial has an empty share
   commit) go to ``core.add_share`` and are noted in a `WindowBook`; a window is folded
   when every partition committed its share, or, once
   the reader has caught up with the stream, when the solver's deadline rule makes it due
   (`WindowBook.due`: the solver judges it then). Each solve window's block is published to
   ``<prefix>.partials.e<k>`` (chunks and a commit, message ids ``block:<k>:<window>...``: a
   second owner of index k rebuilding the same window gets a duplicate ack, the solver one
   block);
4. the clock bucket's ``models`` key is watched; each new value is installed in every core;
5. the rounds (`controller.fleet.stagelink`): each block goes out as its head, without the
   summary rows; the summary stays here as that solve window's range (`StageDesk`, the
   last two solve windows per index) and the solver's stage calls on ``<prefix>.stage.<k>``
   (core request/reply, subscribed while the index is held) are answered from it in a
   worker thread, one at a time per index. A new holder answers only the windows it built
   (a call of another window is refused: the solver judges that window without a clock
   solve).

No acks: the reader keeps its own place (reopened after its last delivery when it stays
silent for two windows, as the solver's is: `ReaderWatch`; a reopen that fails ends the
session, and the next one replays), and a new holder of an index replays. The solver
waits for a solve window's K blocks at most ``edge_wait_ns`` (`SolverLoop`), so a takeover
that replays longer than that costs the solves on the way (judged without a clock solve),
never a wrong one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from nats.aio.msg import Msg

from controller.fleet.book import WindowBook
from controller.fleet.edges import SummaryBlock
from controller.fleet.owner import OwnerCore
from controller.fleet.ownershare import OwnerShare
from controller.fleet.partials import Assembler, PartialWireError, chunk_messages, commit_message
from controller.fleet.plane import MODELS_KEY, SOLVED_KEY, Plane, edge_key
from controller.fleet.sessions import (
    FairShare,
    Follow,
    fleet_link,
    follow_key,
    lease_index,
    run_sessions,
    run_side,
)
from controller.fleet.solverloop import ReaderWatch
from controller.fleet.stagelink import StageDesk, encode_head, stage_subject
from controller.fleet.state import StateError
from mqttlink.reconnect import stop_tasks
from natslink.bigkv import ChunkedKV
from natslink.errors import LINK_ERRORS
from natslink.kvchunks import ChunkError
from natslink.lease import LeaseClock, Leases
from natslink.link import Link
from natslink.settings import NatsSettings
from natslink.streams import Bucket, Entry, open_reader

Log = Callable[..., None]
READ_WAIT_S = 0.25


@dataclass
class OwnerStats:
    """Counters of one owner process."""

    claimed: int = 0
    lost: int = 0
    released: int = 0
    blocks: int = 0
    duplicate_blocks: int = 0
    bad: int = 0
    folded: dict[int, int] = field(default_factory=dict)  # index: its newest folded window


def block_messages(
    block: SummaryBlock, build: str, owner_id: str, chunk_bytes: int, body: bytes | None = None
) -> list[tuple[str, bytes, dict[str, str]]]:
    """Return (message id, payload, headers) of ``block``'s chunks and commit (``body``:
    what goes out for it, by default ``block.encode()``): the partials' wire
    (`controller.fleet.partials`) with ids ``block:<owner>:<window>...``, so one block per
    owner index and window counts."""
    body = block.encode() if body is None else body
    out = chunk_messages(block.owner, block.window, build, body, chunk_bytes)
    out.append(commit_message(block.owner, block.window, build, len(out), owner_id, 0))
    return [("block" + mid.removeprefix("partial"), data, hdr) for mid, data, hdr in out]


class OwnerLoop:
    """The owner process ``owner_id``: holds edge owner indices of ``plane`` on the servers
    of ``settings``; ``make_core(k, solved, models)`` makes a fresh core for index ``k``
    (``solved``: the last window the solver solved, None: none; ``models``: the solver's
    published state, which has the fleet's first coded send). ``clock_ns``: UNIX ns (deadlines);
    ``mono``: monotonic s (leases)."""

    def __init__(
        self,
        plane: Plane,
        settings: NatsSettings,
        owner_id: str,
        make_core: Callable[[int, int | None, bytes | None], OwnerCore],
        *,
        log: Log,
        clock_ns: Callable[[], int] = time.time_ns,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        if plane.edge_owners < 1:
            raise ValueError("an owner process needs [fleet] edge_owners >= 1")
        self.plane, self.settings, self.owner_id = plane, settings, owner_id
        self.make_core, self.log, self.clock_ns, self.mono = make_core, log, clock_ns, mono
        self.leases = Leases(owner_id, LeaseClock(plane.lease_ttl_s), now=mono)
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.cores: dict[int, OwnerCore] = {}
        self.models: bytes | None = None
        self.stats = OwnerStats()
        self.desk = StageDesk()

    def held(self) -> list[int]:
        """Return the owner indices this process works on now."""
        return sorted(self.tasks)

    async def run(self, *, max_attempts: int | None = None) -> None:
        """Run until cancelled, reconnecting with backoff on link errors."""

        try:
            await run_sessions(self.settings, self._session, self.log, self.clock_ns,
                               max_attempts=max_attempts)  # fmt: skip
        finally:
            await self._stop_all()

    async def _session(self, connected: Callable[[], None]) -> None:
        name = f"qpmesh-owner-{self.owner_id}"
        async with fleet_link(self.settings, self.plane, name, self.leases) as fl:
            link = fl.link
            self.log(self.clock_ns(), "connected", server=link.server, owner=self.owner_id)
            connected()
            how = Follow(self.settings.timeout_s, self.leases.clock.renew_s, self.log,
                         self.clock_ns)  # fmt: skip
            try:
                await run_side(link, [
                    self._leases_loop(link, fl.leases, fl.clocks),
                    follow_key(link, fl.clocks, MODELS_KEY, "models", self._take_models, how),
                ])  # fmt: skip
            finally:
                await self._stop_all()  # the next connection replays

    # ---- leases --------------------------------------------------------------------------

    async def _leases_loop(self, link: Link, bucket: Bucket, clocks: ChunkedKV) -> None:
        tick_s = self.leases.clock.renew_s / 2
        share = FairShare("owner", self.owner_id, self.plane.edge_owners, edge_key)
        while True:
            for key in await self.leases.renew():
                self.stats.lost += 1
                await self._stop(lease_index(key), "lost")
            for k, task in list(self.tasks.items()):
                if task.done():  # its lease went, or its link failed: the session ends
                    del self.tasks[k]
                    self.cores.pop(k, None)
                    exc = None if task.cancelled() else task.exception()
                    if exc is not None and not isinstance(exc, _LeaseGone):
                        raise exc
            got, gave = await share.step(self.leases, bucket, self._released, self._claimed)
            self.stats.claimed += got
            self.stats.released += gave
            for key in self.leases.held:
                k = lease_index(key)
                if k not in self.tasks:
                    self.tasks[k] = asyncio.create_task(self._index(link, clocks, k))
            await asyncio.sleep(tick_s)

    async def _released(self, k: int) -> None:
        await self._stop(k, "released")

    def _claimed(self, k: int) -> None:
        self.log(self.clock_ns(), "edge owner claimed", index=k)

    async def _stop(self, k: int, why: str) -> None:
        task = self.tasks.pop(k, None)
        self.cores.pop(k, None)
        if task is not None:
            await stop_tasks([task])
            self.log(self.clock_ns(), f"edge owner {why}", index=k)

    async def _stop_all(self) -> None:
        for k in list(self.tasks):
            await self._stop(k, "stopped")

    def _take_models(self, entry: Entry) -> None:
        """Keep ``models`` current (each index installs it between steps)."""
        self.models = entry.value

    # ---- one owner index -----------------------------------------------------------------

    async def _index(self, link: Link, clocks: ChunkedKV, k: int) -> None:
        entry = await clocks.bucket.get(SOLVED_KEY)
        solved = int(entry.value) if entry is not None else None
        try:
            models = await clocks.get(MODELS_KEY)
            core = self.make_core(k, solved, models.value if models else None)
        except (StateError, ChunkError) as exc:  # bins placed by the replay's first rows instead
            self.log(self.clock_ns(), "bad clock models", error=str(exc))
            core = self.make_core(k, solved, None)
        self.cores[k] = core
        installed: bytes | None = None
        book = WindowBook(self.plane)
        shares = self.settings.subjects.shares_of(k)  # this index's shares, nothing else
        reader = await open_reader(link, self.plane.partial_stream, shares, 1)
        self.log(self.clock_ns(), "edge owner replaying", index=k, solved=solved)
        asm = Assembler()
        caught_up = False
        sub = await self._answer_stages(link, k)
        # every partition commits every window: a reader silent for two windows sits on a dead
        # server (an ephemeral consumer lives on one): opened again after its last delivery
        watch = ReaderWatch(2 * self.plane.window_ns / 1e9, self.mono())
        try:
            while True:
                self._check(k)
                if self.models is not None and self.models is not installed:
                    try:
                        core.install(self.models)
                    except StateError as exc:
                        self.log(self.clock_ns(), "bad clock models", error=str(exc))
                    installed = self.models
                got = await reader.fetch(self.plane.fetch_batch, READ_WAIT_S)
                if got:
                    watch.delivered(got[-1].stream_seq, self.mono())
                elif watch.stalled(self.mono()):
                    with contextlib.suppress(*LINK_ERRORS):
                        await reader.close()
                    start = watch.last_seq + 1 if watch.last_seq is not None else 1
                    reader = await open_reader(link, self.plane.partial_stream, shares, start)
                    self.log(self.clock_ns(), "partial reader reopened", index=k, from_seq=start)
                caught_up = not got or got[-1].pending == 0
                for d in got:
                    try:
                        c = asm.feed(d.headers, d.data)
                        if c is None or not book.add(c.window, c.partition, d.stored_ns):
                            continue
                        if c.body:
                            core.add_share(OwnerShare.decode(c.body))
                    except (PartialWireError, ValueError) as exc:  # ShareError, another's
                        self.stats.bad += 1
                        self.log(self.clock_ns(), "bad share", seq=d.stream_seq, error=str(exc))
                ready = book.due(self.clock_ns()) if caught_up else _complete(book)
                if ready:
                    w = ready[-1]
                    blocks = await asyncio.to_thread(core.advance, w)
                    book.mark_solved(w)
                    self.stats.folded[k] = w
                    for b in blocks:
                        await self._publish(link, k, b, core)
        finally:
            await self._end_stages(k, sub)
            with contextlib.suppress(*LINK_ERRORS):
                await reader.close()

    async def _answer_stages(self, link: Link, k: int) -> Any:
        """Subscribe to index ``k``'s stage subject; return the subscription. Each call is
        answered (`StageDesk.answer`, in a worker thread, one at a time) while the lease
        holds; a call after it went gets no answer (the solver's call times out)."""
        lock = asyncio.Lock()

        async def answer(msg: Msg) -> None:
            async with lock:
                if not self.leases.valid(edge_key(k)):
                    return
                reply = await asyncio.to_thread(self.desk.answer, k, msg.data)
                with contextlib.suppress(Exception):  # the caller gave up: its call times out
                    await msg.respond(reply)

        prefix = self.settings.subjects.prefix
        return await link.nc.subscribe(stage_subject(prefix, k), cb=answer)

    async def _end_stages(self, k: int, sub: Any) -> None:
        """Stop answering index ``k``'s calls and forget its ranges."""
        self.desk.drop(k)
        with contextlib.suppress(Exception):  # a connection already closed
            await sub.unsubscribe()

    def _check(self, k: int) -> None:
        if not self.leases.valid(edge_key(k)):
            raise _LeaseGone(k)

    async def _publish(self, link: Link, k: int, block: SummaryBlock, core: OwnerCore) -> None:
        build = uuid.uuid4().hex[:16]
        subject = self.settings.subjects.blocks(k)
        stages = core.stage.stages(block)  # the rounds of this window run here
        self.desk.keep(k, block.window, stages)
        edges = stages.edges if stages is not None else np.zeros((0, 2), np.int64)
        head = encode_head(block, edges)
        for mid, payload, hdr in block_messages(block, build, self.owner_id,
                                                self.plane.chunk_bytes, head):  # fmt: skip
            self._check(k)  # never publish for an index no longer ours
            ack = await link.publish(subject, payload, msg_id=mid, headers=hdr)
        self.stats.blocks += 1
        self.stats.duplicate_blocks += ack.duplicate
        self.log(self.clock_ns(), "summary block", index=k, window=block.window,
                 rows=block.rows, bytes=len(head), duplicate=ack.duplicate)  # fmt: skip


def _complete(book: WindowBook) -> list[int]:
    """Return the lowest pending windows every partition committed, in order."""
    out = []
    for w in sorted(book.pending):
        if not book.complete(w):
            break
        out.append(w)
    return out


class _LeaseGone(Exception):
    """This process may no longer use edge owner index ``k``'s lease."""


__all__ = ["OwnerLoop", "OwnerStats", "block_messages"]
