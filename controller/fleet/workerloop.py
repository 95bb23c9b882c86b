"""``qpmesh controller worker``: an ingest worker's shell on NATS JetStream.

One connection's lifetime (`WorkerLoop.run` reconnects through the project's one loop,
`mqttlink.reconnect`, with ``[nats]``'s backoff):

1. set up the streams and buckets of the `Plane` (idempotent);
2. every lease tick (a third of the lease TTL at most): renew the partition leases held
   (`natslink.lease.Leases`), register this worker (``worker.<id>``, same TTL), and claim
   free partitions up to a fair share, ``ceil(partitions / live workers)``; give back
   partitions above the share. A partition lost (renewal failed, or not renewed within the
   lease's safe time) stops at once: its task is cancelled, its core and unacked messages
   dropped, nothing of it published;
3. per owned partition a task: the durable pull consumer ``part-<p>`` restarted at its ack
   floor (`natslink.streams.restart_from_ack_floor`: what a previous owner held unacked
   comes at once), a fresh core (`WorkerCore`, with the newest clock models), fetch ->
   ``core.admit(host, payload, stored_ns)``: a batch's arrival is when the stream stored it,
   the same for every owner, so a new owner replaying a batch puts its records in the windows
   its predecessor did (refused batches are acked at once). Windows are closed on stream
   time only: before a message is admitted, ``core.close(its close point)`` (in a thread:
   ingest of other partitions goes on), the message's stored time through the partition's
   `StreamClock`: after a jump of stream time (the stream could store nothing: a server
   that led it died, and the probers spooled meanwhile) the point stays where it was until
   a grace has passed after the jump (a stall of the stream during that hold, a leader
   election settling, holds it a grace after the stall, at most two graces after the jump:
   `controller.fleet.watermark.StreamClock`), so the spooled batches are stored before their
   windows close. When nothing comes for `FETCH_WAIT_S`, the owner stores a tick in the
   partition (``<prefix>.probes.<p>.~tick``), whose stored time closes the windows when it
   is read back; a tick is acked with its window, as a batch is. Each closed window's partial is sent (`controller.fleet.partials`: chunks, then
   the commit ``partial:<p>:<window>``). A window with no partial gets an empty commit, so the
   solver knows it is complete. With ``[fleet] edge_owners = K`` (``cut``:
   `controller.fleet.ownershare.OwnerCut`) each partial is first cut into K owner shares,
   each sent as a build of its own on ``<prefix>.partials.c<k>.<p>`` (commit
   ``share<k>:<p>:<window>``; an empty one when there is no partial), and then the solver's
   partial without the clock rows the owners hold (`ownershare.solver_part`): a committed
   partial had all its shares committed (a rebuild after a takeover sends the same). A batch is acked once every window that can hold its records
   (those up to its arrival's) is committed;
4. clock models: the clock bucket's ``models`` key is watched and installed in every core;
5. a learned fabric (``fabric``: a `controller.fleet.fabricwire.FabricFollow`): the clock
   bucket's ``fabric`` key (the solver's newest version) is watched as the models are. Until
   a version came, an owned partition opens no consumer: its batches stay unacked in the
   probe stream (its max age) instead of being refused on an empty fabric and acked. A new
   version replaces each partition's core between two fetches by a fresh one on it
   (``make_core``, as a new owner's: what the old core held in open windows is dropped, as
   one process drops its open windows at a change), and models written before the version
   are not installed on it (`FabricFollow.fits`; models that do not fit a core's size are
   skipped and logged).

Exactly once: each partition's window is committed once (the commit's message id). A new
owner replays from the ack floor; a window it rebuilds that its predecessor had committed gets
a duplicate ack (dropped whole: nothing counted twice), one that was not is committed now
(no batch lost). The rebuilt windows are the predecessor's: arrivals are stream times and the
closes happen at the same points of the stream, ticks included (a fresh core's first close,
before the first replayed message, puts its floor where the predecessor's was then; its
stream clock is seeded with the stored time of the ack floor's message, and a held outage
keeps the ack floor before it), so every record lands in the window it landed in before. Giving a partition back, losing it and
crashing are the same transition.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from controller.admission import Outcome
from controller.fleet.cores import PartialLike, WorkerCore
from controller.fleet.fabricwire import FABRIC_KEY, FabricFollow, FabricWireError
from controller.fleet.ownershare import WireCut
from controller.fleet.partials import chunk_messages, commit_message
from controller.fleet.plane import MODELS_KEY, Plane, partition_key
from controller.fleet.sessions import (
    FairShare,
    Follow,
    fleet_link,
    follow_key,
    lease_index,
    run_sessions,
    run_side,
)
from controller.fleet.state import StateError
from controller.fleet.watermark import StreamClock
from mqttlink.reconnect import Backoff, stop_tasks
from natslink.errors import LINK_ERRORS, NatsUnavailable
from natslink.lease import LeaseClock, Leases
from natslink.link import Ack, Link
from natslink.settings import NatsSettings
from natslink.streams import (
    Bucket,
    Delivery,
    Entry,
    open_pull,
    restart_from_ack_floor,
    stored_at,
)

Log = Callable[..., None]
FETCH_WAIT_S = 0.5


def _host_of(subject: str) -> str:
    return subject.rsplit(".", 1)[-1]


@dataclass
class PartitionState:
    """One owned partition: its core, the stream clock its windows close on (the stored
    times of its messages, outages held: `StreamClock`), the deliveries held until every
    window that can hold their records is committed (per arrival window), the first window
    whose (possibly empty) commit is still to be sent."""

    core: WorkerCore
    clock: StreamClock
    next_window: int | None = None  # None: the core was never closed (its floor not set)
    held: dict[int, list[Delivery]] = field(default_factory=dict)
    models: bytes | None = None  # the clock models installed in ``core``
    fabric: str = ""  # the learned fabric version ``core`` is on ("": the declared one)


@dataclass
class WorkerStats:
    """Counters of one worker process."""

    admitted: int = 0
    refused: int = 0
    commits: int = 0
    duplicate_commits: int = 0
    acked: int = 0
    claimed: int = 0
    lost: int = 0
    released: int = 0


class WorkerLoop:
    """The worker ``worker_id``: owns partitions of ``plane`` on the servers of ``settings``;
    ``make_core(p)`` makes a fresh core for partition ``p`` (its partials name ``p``, not
    the worker: a partition's partial of a window is the same whoever builds it). ``clock_ns``: UNIX ns (windows);
    ``mono``: monotonic s (leases); ``fabric``: a learned fabric's versions, taken from the
    clock bucket (``make_core`` builds on the newest; None: a declared fabric)."""

    def __init__(
        self,
        plane: Plane,
        settings: NatsSettings,
        worker_id: str,
        make_core: Callable[[int], WorkerCore],
        *,
        log: Log,
        clock_ns: Callable[[], int] = time.time_ns,
        mono: Callable[[], float] = time.monotonic,
        fabric: FabricFollow | None = None,
    ) -> None:
        self.plane, self.settings, self.worker_id = plane, settings, worker_id
        self.cut: Callable[[PartialLike], WireCut] | None = None
        self.fabric = fabric
        self.models_revision = 0
        self.subjects = settings.subjects
        self.make_core, self.log, self.clock_ns, self.mono = make_core, log, clock_ns, mono
        self.leases = Leases(worker_id, LeaseClock(plane.lease_ttl_s), now=mono)
        self.parts: dict[int, PartitionState] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.models: bytes | None = None
        self.stats = WorkerStats()
        self.failed: dict[int, tuple[Backoff, float]] = {}  # p: (its backoff, retry at)

    def owned(self) -> list[int]:
        """Return the partitions this worker consumes now."""
        return sorted(self.tasks)

    def use_owners(self, cut: Callable[[PartialLike], WireCut]) -> None:
        """Send each partial cut for the edge owners (``[fleet] edge_owners``): ``cut``
        returns its solver part and owner shares (`controller.fleet.ownershare.OwnerCut`)."""
        self.cut = cut

    async def run(self, *, max_attempts: int | None = None) -> None:
        """Run until cancelled, reconnecting with backoff on link errors. Raises ValueError
        when the fleet has edge owners and no cut was given (`use_owners`)."""
        if self.plane.edge_owners and self.cut is None:
            raise ValueError("a worker of a fleet with edge owners needs their cut (use_owners)")

        try:
            await run_sessions(self.settings, self._session, self.log, self.clock_ns,
                               max_attempts=max_attempts)  # fmt: skip
        finally:
            await self._stop_all()

    async def _session(self, connected: Callable[[], None]) -> None:
        name = f"qpmesh-worker-{self.worker_id}"
        async with fleet_link(self.settings, self.plane, name, self.leases, probes=True) as fl:
            link = fl.link
            self.log(self.clock_ns(), "connected", server=link.server, worker=self.worker_id)
            connected()
            how = Follow(self.settings.timeout_s, self.leases.clock.renew_s, self.log,
                         self.clock_ns)  # fmt: skip
            side = [self._leases_loop(link, fl.leases),
                    follow_key(link, fl.clocks, MODELS_KEY, "models", self._take_models, how)]  # fmt: skip
            if self.fabric is not None:
                side.append(follow_key(link, fl.clocks, FABRIC_KEY, "fabric", self._take_fabric,
                                       how))  # fmt: skip
            try:
                await run_side(link, side)
            finally:
                await self._stop_all()  # the next connection restarts them at the ack floor

    # ---- leases --------------------------------------------------------------------------

    async def _leases_loop(self, link: Link, bucket: Bucket) -> None:
        tick_s = self.leases.clock.renew_s / 2
        share = FairShare("worker", self.worker_id, self.plane.partitions, partition_key)
        while True:
            for key in await self.leases.renew():
                self.stats.lost += 1
                await self._stop(lease_index(key), "lost")
            for p, task in list(self.tasks.items()):
                if task.done():  # a partition task ended: its lease went, or its link failed
                    del self.tasks[p]
                    self.parts.pop(p, None)
                    exc = None if task.cancelled() else task.exception()
                    if isinstance(exc, NatsUnavailable) and not (
                        link.lost.is_set() or link.nc.is_closed
                    ):
                        # one consumer timed out (its raft group electing a leader): that
                        # partition starts again below at its ack floor, the others go on
                        # (ending the session would re-create every consumer at once)
                        backoff = (
                            self.failed[p][0]
                            if p in self.failed
                            else Backoff(tick_s, self.leases.clock.ttl_s, jitter=0.2)
                        )  # the project's one backoff, per partition: each start
                        delay = backoff.next_delay()
                        self.failed[p] = (backoff, self.mono() + delay)
                        self.log(
                            self.clock_ns(),
                            "partition failed",
                            partition=p,  # re-creates
                            error=str(exc),
                            retry_in_s=round(delay, 3),
                        )  # its consumer
                    elif exc is not None and not isinstance(exc, _LeaseGone):
                        raise exc
            got, gave = await share.step(self.leases, bucket, self._released, self._claimed)
            self.stats.claimed += got
            self.stats.released += gave
            for key in self.leases.held:
                p = lease_index(key)
                if p not in self.tasks and (
                    p not in self.failed or self.mono() >= self.failed[p][1]
                ):
                    self.tasks[p] = asyncio.create_task(self._partition(link, p))
            await asyncio.sleep(tick_s)

    async def _released(self, p: int) -> None:
        await self._stop(p, "released")

    def _claimed(self, p: int) -> None:
        self.log(self.clock_ns(), "partition claimed", partition=p)

    async def _stop(self, p: int, why: str) -> None:
        task = self.tasks.pop(p, None)
        self.parts.pop(p, None)
        self.failed.pop(p, None)
        if task is not None:
            await stop_tasks([task])
            self.log(self.clock_ns(), f"partition {why}", partition=p)

    async def _stop_all(self) -> None:
        for p in list(self.tasks):
            await self._stop(p, "stopped")

    # ---- clock models and a learned fabric -----------------------------------------------

    def _take_models(self, entry: Entry) -> None:
        """Keep the newest models (each partition installs them between steps)."""
        self.models, self.models_revision = entry.value, entry.revision

    def _take_fabric(self, entry: Entry) -> None:
        """Take a fabric version the solver wrote (``fabric`` in the clock bucket; the newest
        first, so a worker that starts late builds on it)."""
        follow = self.fabric
        assert follow is not None
        try:
            if follow.take(entry.value, entry.revision):
                fab = follow.fabric
                self.log(self.clock_ns(), "fabric followed", fabric=follow.id,
                         revision=entry.revision,
                         nics=len(fab.nics) if fab is not None else 0)  # fmt: skip
        except FabricWireError as exc:
            self.log(self.clock_ns(), "bad fabric version", error=str(exc))

    async def _fabric_known(self, p: int) -> None:
        """Return once a learned fabric's first version came (at once with a declared
        fabric); meanwhile the partition opens nothing. Raises `_LeaseGone` when its lease
        is lost while waiting."""
        logged = False
        while self.fabric is not None and self.fabric.fabric is None:
            self._check_lease(p)
            if not logged:
                self.log(self.clock_ns(), "partition waits for a fabric", partition=p)
                logged = True
            await asyncio.sleep(FETCH_WAIT_S)

    def _follow(self, p: int, st: PartitionState) -> None:
        """Rebuild ``st``'s core on a new fabric version (module doc, step 5)."""
        if self.fabric is None or st.fabric == self.fabric.id:
            return
        st.core, st.fabric, st.models = self.make_core(p), self.fabric.id, None
        if st.next_window is not None:  # its floor where the old core's was (nothing to send)
            st.core.close(self.plane.window_end(st.next_window - 1) + self.plane.grace_ns)
        self.log(self.clock_ns(), "partition refabric", partition=p, fabric=st.fabric)

    def _install(self, st: PartitionState) -> None:
        """Install the newest clock models in ``st``'s core when they are new to it and (a
        learned fabric) written after its version."""
        if self.models is None or self.models is st.models:
            return
        if self.fabric is not None and not self.fabric.fits(self.models_revision):
            return
        try:
            st.core.install_clock(self.models)  # never while close runs in its thread
        except StateError as exc:  # of another fabric's size: the next models will fit
            self.log(self.clock_ns(), "models skipped", error=str(exc))
        st.models = self.models

    # ---- one partition -------------------------------------------------------------------

    async def _partition(self, link: Link, p: int) -> None:
        await self._fabric_known(p)
        stream, durable = self.plane.probe_stream, f"part-{p}"
        subject = self.subjects.probes_partition(p)
        tick = self.subjects.probes_tick(p)
        ack_wait = (self.plane.window_ns + 2 * self.plane.grace_ns) / 1e9 + 30.0
        start = await restart_from_ack_floor(link, stream, durable, subject, ack_wait_s=ack_wait)
        pull = await open_pull(link, stream, durable, subject, ack_wait_s=ack_wait)
        st = PartitionState(self.make_core(p),
                            StreamClock(self.plane.grace_ns, self.plane.stream_gap_ns),
                            fabric=self.fabric.id if self.fabric is not None else "")  # fmt: skip
        before = await stored_at(link, stream, start - 1)  # the ack floor: a jump after it
        if before is not None:  # is an outage for this owner as it was for its predecessor
            st.clock.seed(before)
        self.parts[p] = st
        self.failed.pop(p, None)
        self.log(self.clock_ns(), "partition consuming", partition=p, from_seq=start)
        try:
            while True:
                self._check_lease(p)
                self._follow(p, st)
                self._install(st)
                got = await pull.fetch(self.plane.fetch_batch, FETCH_WAIT_S)
                for d in got:
                    await self._advance(link, p, st, st.clock.at(d.stored_ns))
                    if d.subject == tick:  # acked with its window, as a batch: the ack
                        self._hold(st, d)  # floor stays before an outage being held
                    else:
                        await self._admit(st, d)
                if not got:  # idle: store a tick, whose stored time closes windows
                    await link.publish(tick, b"")
        finally:
            with contextlib.suppress(*LINK_ERRORS):
                await pull.close()

    def _check_lease(self, p: int) -> None:
        if not self.leases.valid(partition_key(p)):
            raise _LeaseGone(p)

    async def _admit(self, st: PartitionState, d: Delivery) -> None:
        arrival = d.stored_ns
        verdict = st.core.admit(_host_of(d.subject), d.data, arrival)
        if verdict.accepted or verdict.outcome is Outcome.DUPLICATE:
            # a duplicate is acked with the windows of its first copy, never before them
            self._hold(st, d)
            self.stats.admitted += verdict.accepted
            return
        self.stats.refused += 1
        await d.ack()

    def _hold(self, st: PartitionState, d: Delivery) -> None:
        """Hold ``d`` until every window up to its arrival's is committed."""
        st.held.setdefault(self.plane.window_of(d.stored_ns), []).append(d)

    async def _advance(self, link: Link, p: int, st: PartitionState, upto: int) -> None:
        """Close (and commit) the windows that end ``grace`` before ``upto`` (the close
        point of the next message, a batch or a tick: its stored time, or the time before an
        outage the stream clock holds), once per window boundary."""
        first_open = self.plane.closable(upto)
        if st.next_window is not None and first_open <= st.next_window:
            return
        partials = await asyncio.to_thread(st.core.close, upto)  # windows below first_open
        if st.next_window is None:  # the core's first close: its floor, nothing to send
            st.next_window = first_open
        by_window: dict[int, PartialLike] = {pt.window: pt for pt in partials}
        for w in sorted(set(by_window) | set(range(st.next_window, first_open))):
            self._check_lease(p)  # never publish for a partition no longer ours
            await self._commit(link, p, w, by_window.get(w))
        st.next_window = max(st.next_window, first_open)
        for w in [w for w in st.held if w < first_open]:  # every window it can be in: out
            for d in st.held.pop(w):
                await d.ack()
                self.stats.acked += 1

    async def _commit(self, link: Link, p: int, w: int, pt: PartialLike | None) -> None:
        batches = len(pt.covers) if pt is not None else 0
        body = pt.encode() if pt is not None else b""
        if self.cut is not None:  # the owners' shares first: a committed partial has them all
            cut = await asyncio.to_thread(self.cut, pt) if pt is not None else None
            for k in range(self.plane.edge_owners):
                share = cut.shares[k] if cut is not None else b""
                await self._send(link, self.subjects.shares(k, p), p, w, share, batches,
                                 f"share{k}")  # fmt: skip
            body = cut.part if cut is not None else b""
        ack = await self._send(link, self.subjects.partials(p), p, w, body, batches, "partial")
        self.stats.commits += 1
        self.stats.duplicate_commits += ack.duplicate

    async def _send(
        self, link: Link, subject: str, p: int, w: int, body: bytes, batches: int, kind: str
    ) -> Ack:
        """Send ``body`` as one build (chunks, then its commit ``<kind>:<p>:<w>``); return
        the commit's ack."""
        build = uuid.uuid4().hex[:16]
        chunks = chunk_messages(p, w, build, body, self.plane.chunk_bytes, kind)
        for mid, payload, hdr in chunks:
            await link.publish(subject, payload, msg_id=mid, headers=hdr)
        mid, payload, hdr = commit_message(p, w, build, len(chunks), self.worker_id, batches,
                                           kind)  # fmt: skip
        return await link.publish(subject, payload, msg_id=mid, headers=hdr)


class _LeaseGone(Exception):
    """This worker may no longer use partition ``p``'s lease (ends its task quietly)."""
