"""RDMA transport: UD QPs per NIC, NIC or host stamps, source-port sweep per device kind.

Written against pyverbs (rdma-core ``tests/base.py`` / ``tests/utils.py`` patterns). Runs on
Soft-RoCE (``rdma_rxe``) in a VM (`testbed.rxevm`, tests marked ``rxe``) and is meant for
mlx5 hardware, where the NIC-clock and flow-label parts below are still unverified.

Per NIC:

- ``Context(name=rdma_device)``, ``PD``, one ``MR`` holding the receive slots (each 40-byte
  GRH + message) and a ring of send slots;
- stamps: two ``CQEX`` with ``IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP``
  when the device has a NIC clock (``hca_core_clock`` > 0): the send completion's timestamp
  is t1/t3, the receive completion's t2/t4, raw cycles -> ns with `HcaClock`
  (``stamp_source`` ``"hw"``). A device without completion timestamps (rxe: that CQEX fails
  with EOPNOTSUPP and ``hca_core_clock`` is 0) gets plain CQs and host-clock stamps
  (``time.time_ns``, ``stamp_source`` ``"sw"``, so batches are flagged ``stamp = "sw"``):
  t1/t3 right before ``post_send`` (rxe hands the packet to the IP stack inside that call; a
  stamp after it returned could come after the peer's receive stamp if the process is
  preempted there), t2/t4 once per receive-CQ poll, right after the poll found completions;
- the source-port sweep, per device kind (`sport_mode`):
  ``flow_label`` (mlx5, the default): one UD QP and one global address handle per (peer GID,
  source port) with ``flow_label_for_sport(sport)``, so the NIC puts ``sport`` in the RoCEv2
  UDP header; ``per_qp`` (rxe, vendor id 0xFFFFFF): rxe ignores the flow label and uses a
  fixed port per QP (`rxe_sport_of_qpn`), so the NIC gets up to `MAX_SWEEP_QPS` UD QPs, the
  scheduled ports are spread over them, and results/losses carry the port actually on the
  wire (`wire_sport`). The first QP is the one announced in presence (it receives probes);
  replies come back to whichever QP sent the probe;
- all QPs share one send and one receive CQ; a receive's ``wr_id`` is its slot, and the slot
  says which QP to re-post it on.

Addresses given to the session are ``(peer GID, peer QPN)``, learnt at run time: every RDMA
prober announces its NICs' (qpn, gid, qkey, port) in its retained presence document and
follows everyone else's into a shared `RdmaPeerTable` (`prober.rdma.peers`,
`prober.rdma.presence`). The agent asks `RdmaEndpoint.resolve` for each probe's destination: a
peer not known yet is skipped and counted (``peer_unknown``), never reported as lost. When the
table says a peer changed, `RdmaEndpoint.refresh_peer` creates its address handles (one per
source port) or retires them (`ah_plan`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import ipaddress
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from prober.config import NicConfig, ProberConfig
from prober.endpoint import NicTransport, session_hot_path
from prober.events import Datagram, ProbeEvent, ProbeLost, ProbeResult
from prober.publish import Publisher
from prober.rdma.clock import HcaClock
from prober.rdma.discover import RdmaUnavailable
from prober.rdma.flowlabel import RXE_VENDOR_ID, flow_label_for_sport, rxe_sport_of_qpn
from prober.rdma.packet import GRH_SIZE, PacketError, grh_source, split_grh
from prober.rdma.peers import AhKey, PeerAddress, RdmaPeerTable, ah_plan, local_address
from prober.session import ProbeSession
from prober.wire import BODY_LEN, MAX_PAD, TAG_LEN, Codec

QKEY = 0x11111111
RECV_SLOTS = 512  # on the announced QP (probes from every peer arrive there)
REPLY_SLOTS = 64  # on each extra sweep QP (only replies to its own probes arrive there)
SEND_SLOTS = 256
SLOT = GRH_SIZE + BODY_LEN + MAX_PAD + TAG_LEN
MAX_SWEEP_QPS = 8
POLL_BATCH = 32
NO_STAMP_ERRNOS = (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL)


def sweep_assignment(sports: Sequence[int], n_qps: int) -> dict[int, int]:
    """Return scheduled source port -> QP index (0..n_qps-1), round robin in sweep order.

    Port 0 (replies: "any port") always maps to QP 0. Raises `ValueError` if n_qps < 1.
    """
    if n_qps < 1:
        raise ValueError("need at least one QP")
    out = {0: 0}
    for i, s in enumerate(dict.fromkeys(sports)):
        out[s] = i % n_qps
    return out


def rewrite_sports(events: list[ProbeEvent], wire: dict[int, int]) -> list[ProbeEvent]:
    """Return ``events`` with every result's/loss's ``sport`` replaced by its wire port.

    Ports missing from ``wire`` are kept. Other events pass unchanged (pure).
    """
    out: list[ProbeEvent] = []
    for ev in events:
        if isinstance(ev, ProbeResult | ProbeLost) and wire.get(ev.sport, ev.sport) != ev.sport:
            out.append(dataclasses.replace(ev, sport=wire[ev.sport]))
        else:
            out.append(ev)
    return out


def full_gid(gid: str) -> str:
    """Return ``gid`` (IPv6 text or dotted IPv4 for RoCEv2/IPv4) as the 8 x 4-hex-digit form
    pyverbs' ``GID`` parses. Raises `ValueError` on bad text."""
    if "." in gid and ":" not in gid:
        gid = f"::ffff:{gid}"
    return ipaddress.IPv6Address(gid).exploded


class RdmaEndpoint:
    """Carry one NIC's `ProbeSession` over UD QPs (same shape as `prober.udp.UdpEndpoint`)."""

    def __init__(
        self,
        session: ProbeSession,
        nic: NicConfig,
        *,
        sports: Sequence[int] = (),
        on_events: Callable[[list[ProbeEvent]], None] | None = None,
        poll_interval_s: float = 0.0005,
        idle_poll_max_s: float = 0.004,
        peers: RdmaPeerTable | None = None,
    ) -> None:
        self.session = session
        self.nic = nic
        self.sports = tuple(sports)
        self.on_events = on_events
        self.poll_interval_s = poll_interval_s
        self.idle_poll_max_s = idle_poll_max_s
        self.counters: Counter[str] = Counter()
        self.stamp_source = "hw"
        self.sport_mode = "flow_label"
        self.clock: HcaClock | None = None
        self.qpn = 0
        self.qpns: tuple[int, ...] = ()
        self.gid = ""
        self.wire_sport: dict[int, int] = {}  # scheduled port -> port on the wire (per_qp)
        self.peers = peers if peers is not None else RdmaPeerTable()
        self._v: Any = None  # pyverbs objects, created in open()
        self._qps: list[Any] = []
        self._slot_qp: list[int] = []  # receive slot -> index of the QP it is posted on
        self._sport_qp: dict[int, int] = {0: 0}
        self._n_recv = 0
        self._ahs: dict[AhKey, Any] = {}
        self._retired: list[Any] = []  # AHs of changed peers; freed on close (sends may use them)
        self._peer_state: dict[str, PeerAddress] = {}  # what the AHs were made for
        self._qkeys: dict[tuple[str, int], int] = {}  # (gid, qpn) -> qkey of learnt peers
        self._send_tokens: dict[int, int] = {}
        self._next_send = 0
        self._closed = False
        self._wake = asyncio.Event()

    # ---- setup ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the endpoint (no warm-up: the stamp source is known once open)."""
        self.open()

    def open(self) -> None:
        """Create the verbs resources; raise `RdmaUnavailable` on any verbs error."""
        try:
            import pyverbs.enums as e
            from pyverbs.device import Context
            from pyverbs.mr import MR
            from pyverbs.pd import PD
            from pyverbs.pyverbs_error import PyverbsError
            from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
        except ImportError as exc:
            raise RdmaUnavailable(f"pyverbs unavailable: {exc}") from None
        dev = self.nic.rdma_device
        try:
            ctx = Context(name=dev)
            vendor = int(ctx.query_device().vendor_id)
            self.sport_mode = "per_qp" if vendor == RXE_VENDOR_ID else "flow_label"
            pd = PD(ctx)
            n_qps = 1 if self.sport_mode == "flow_label" else min(len(self.sports) or 1,
                                                                  MAX_SWEEP_QPS)  # fmt: skip
            self._n_recv = RECV_SLOTS + (n_qps - 1) * REPLY_SLOTS
            scq, rcq = self._make_cqs(ctx, e, 2 * SEND_SLOTS, self._n_recv)
            cap = QPCap(max_send_wr=SEND_SLOTS, max_recv_wr=RECV_SLOTS, max_send_sge=1,
                        max_recv_sge=1)  # fmt: skip
            init = QPInitAttr(qp_type=e.IBV_QPT_UD, scq=scq, rcq=rcq, cap=cap, sq_sig_all=1)
            qp_attr = QPAttr(port_num=self.nic.rdma_port)
            qp_attr.qkey = QKEY
            self._qps = [QP(pd, init, qp_attr) for _ in range(n_qps)]
            mr = MR(pd, SLOT * (self._n_recv + SEND_SLOTS), e.IBV_ACCESS_LOCAL_WRITE)
        except PyverbsError as exc:
            raise RdmaUnavailable(f"{dev}: {exc}") from None
        self.qpns = tuple(int(qp.qp_num) for qp in self._qps)
        self.qpn = self.qpns[0]
        self._sport_qp = sweep_assignment(self.sports, n_qps)
        if self.sport_mode == "per_qp":
            wires = [rxe_sport_of_qpn(q) for q in self.qpns]
            self.wire_sport = {s: wires[i] for s, i in self._sport_qp.items() if s}
        try:
            self.gid = str(ctx.query_gid(self.nic.rdma_port, self.nic.gid_index))
        except PyverbsError as exc:
            raise RdmaUnavailable(f"{dev}: GID {self.nic.gid_index}: {exc}") from None
        self._v = {"ctx": ctx, "pd": pd, "scq": scq, "rcq": rcq, "mr": mr, "e": e}
        self._slot_qp = [0] * RECV_SLOTS + [
            1 + k // REPLY_SLOTS for k in range(self._n_recv - RECV_SLOTS)
        ]
        for slot in range(self._n_recv):
            self._post_recv(slot)

    def _make_cqs(self, ctx: Any, e: Any, n_send: int, n_recv: int) -> tuple[Any, Any]:
        """Return (send CQ, receive CQ): NIC-stamped if the device can, else host-stamped.

        Sets `stamp_source` and `clock`. Raises `PyverbsError` on other verbs errors.
        """
        from pyverbs.cq import CQEX, CqInitAttrEx
        from pyverbs.pyverbs_error import PyverbsRDMAError

        khz = int(ctx.query_device_ex().hca_core_clock)
        if khz > 0:
            flags = e.IBV_WC_STANDARD_FLAGS | e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
            try:
                scq = CQEX(ctx, CqInitAttrEx(cqe=n_send, wc_flags=flags))
                rcq = CQEX(ctx, CqInitAttrEx(cqe=n_recv, wc_flags=flags))
                mask = int(ctx.query_device_ex().completion_timestamp_mask) or (1 << 64) - 1
                _, cycles = ctx.query_rt_values_ex()
                self.clock = HcaClock(khz, int(cycles) & mask, time.time_ns(), mask)
                self.stamp_source = "hw"
                return scq, rcq
            except PyverbsRDMAError as exc:
                if exc.error_code not in NO_STAMP_ERRNOS:
                    raise
                self.counters["no_completion_timestamps"] += 1
        from pyverbs.cq import CQ

        self.clock = None
        self.stamp_source = "sw"
        return CQ(ctx, n_send), CQ(ctx, n_recv)

    def close(self) -> None:
        """Release the verbs resources (idempotent)."""
        self._closed = True
        self._wake.set()
        if self._v is not None:
            for ah in [*self._ahs.values(), *self._retired]:
                with contextlib.suppress(Exception):
                    ah.close()
            self._ahs.clear()
            self._retired.clear()
            for qp in self._qps:
                qp.close()
            self._qps = []
            for key in ("mr", "scq", "rcq", "pd", "ctx"):
                obj = self._v.get(key)
                if obj is not None:
                    obj.close()
            self._v = None

    def _post_recv(self, slot: int) -> None:
        from pyverbs.wr import SGE, RecvWR

        mr = self._v["mr"]
        sge = SGE(mr.buf + slot * SLOT, SLOT, mr.lkey)
        self._qps[self._slot_qp[slot]].post_recv(RecvWR(wr_id=slot, num_sge=1, sg=[sge]))

    def _create_ah(self, gid: str, sport: int) -> Any:
        from pyverbs.addr import AH, GID, AHAttr, GlobalRoute

        fl = flow_label_for_sport(sport) if sport and self.sport_mode == "flow_label" else 0
        gr = GlobalRoute(dgid=GID(full_gid(gid)), flow_label=fl, sgid_index=self.nic.gid_index,
                         hop_limit=64)  # fmt: skip
        return AH(self._v["pd"], attr=AHAttr(port_num=self.nic.rdma_port, is_global=1, gr=gr))

    def _ah(self, gid: str, sport: int) -> Any:
        if self.sport_mode == "per_qp":
            sport = 0  # rxe ignores the flow label: one AH per peer does
        key = (gid, sport)
        ah = self._ahs.get(key)
        if ah is None:
            ah = self._ahs[key] = self._create_ah(gid, sport)
        return ah

    # ---- peers ----------------------------------------------------------------------------

    def local_address(self, host: str) -> PeerAddress:
        """Return this NIC's UD address for the presence document (after `open`)."""
        return local_address(host, self.nic.id, self.qpn, self.gid, QKEY, self.nic.rdma_port)

    def resolve(self, nic_id: str, configured: object = None) -> tuple[str, int] | None:
        """Return the (gid, qpn) to probe NIC ``nic_id`` at; None (counted) while unknown.

        ``configured`` (the peer's configured IP address) is not used: RDMA peers are learnt
        from their presence."""
        peer = self.peers.lookup(nic_id)
        if peer is None:
            self.counters["peer_unknown"] += 1
            self.session.counters["peer_unknown"] += 1  # visible in the health document
            return None
        self._qkeys[peer.dest] = peer.qkey
        return peer.dest

    def refresh_peer(self, nic_id: str) -> tuple[int, int]:
        """Bring the address handles of ``nic_id`` in line with the table (`ah_plan`).

        Returns (retired, created). Retired AHs are kept until `close` (a posted send may
        still use them). Before `open`, only the bookkeeping is updated. AH errors are counted.
        """
        old = self._peer_state.get(nic_id)
        new = self.peers.lookup(nic_id)
        retire, create = ah_plan(old, new, self.sports)
        if new is None:
            self._peer_state.pop(nic_id, None)
        else:
            self._peer_state[nic_id] = new
        for gid, sport in retire:
            ah = self._ahs.pop((gid, 0 if self.sport_mode == "per_qp" else sport), None)
            if ah is not None:
                self._retired.append(ah)
        made = 0
        if self._v is not None:
            for gid, sport in create:
                try:
                    self._ah(gid, sport)
                    made += 1
                except Exception as exc:  # PyverbsRDMAError: no route to the GID, bad index
                    self.counters[f"ah_error_{type(exc).__name__}"] += 1
        self.counters["ah_created"] += made
        self.counters["ah_retired"] += len(retire)
        return len(retire), made

    # ---- data path ------------------------------------------------------------------------

    def now_ns(self) -> int:
        """Return this NIC's clock now: the HCA clock, or the host clock for "sw" stamps."""
        if self.clock is None:
            return time.time_ns()
        _, cycles = self._v["ctx"].query_rt_values_ex()
        return self.clock.to_ns(int(cycles))

    def send(self, dgram: Datagram) -> list[ProbeEvent]:
        """Post one UD send to ``dgram.dest = (gid, qpn)``; return events a host stamp completed.

        The QP (and so, on rxe, the wire port) is the one `sweep_assignment` gave
        ``dgram.meta.sport``; on mlx5 the AH's flow label sets the port. Errors are counted.
        """
        from pyverbs.wr import SGE, SendWR

        gid, qpn = dgram.dest
        slot = self._n_recv + self._next_send % SEND_SLOTS
        self._next_send += 1
        mr = self._v["mr"]
        mr.write(dgram.data, len(dgram.data), slot * SLOT)
        wr = SendWR(wr_id=slot, opcode=self._v["e"].IBV_WR_SEND, num_sge=1,
                    sg=[SGE(mr.buf + slot * SLOT, len(dgram.data), mr.lkey)])  # fmt: skip
        qkey = self._qkeys.get((str(gid), int(qpn)), QKEY)
        qp = self._qps[self._sport_qp.get(dgram.meta.sport, 0)]
        try:
            wr.set_wr_ud(self._ah(str(gid), dgram.meta.sport), int(qpn), qkey)
            host_ns = time.time_ns()  # "sw" stamp: right before the post (never after the wire)
            qp.post_send(wr)
        except Exception as exc:  # PyverbsRDMAError: queue full, bad AH
            self.counters[f"send_error_{type(exc).__name__}"] += 1
            return []
        if not dgram.meta.wants_tx_stamp:
            return []
        if self.clock is None:
            return self.session.on_tx_stamp(dgram.meta.token, host_ns)
        self._send_tokens[slot] = dgram.meta.token
        return []

    def _poll(self, cq: Any, on_wc: Callable[[int, int, int, int], None]) -> int:
        """Hand every completion of ``cq`` to ``on_wc(wr_id, byte_len, src_qp, stamp_ns)``.

        ``stamp_ns`` is the NIC stamp, or one host-clock read right after the poll found
        completions ("sw": a plain CQ, ``ibv_poll_cq`` in batches of `POLL_BATCH`).
        Returns how many completions there were.
        """
        e = self._v["e"]
        total = 0
        if self.clock is None:
            while True:
                got, wcs = cq.poll(POLL_BATCH)
                n = int(got)
                if n <= 0:
                    return total
                total += n
                host_ns = time.time_ns()
                for wc in wcs[:n]:
                    if wc.status == e.IBV_WC_SUCCESS:
                        on_wc(int(wc.wr_id), int(wc.byte_len), int(wc.src_qp), host_ns)
                    else:
                        self.counters[f"wc_status_{wc.status}"] += 1
                if n < POLL_BATCH:
                    return total
        from pyverbs.cq import PollCqAttr

        if cq.start_poll(PollCqAttr()) != 0:
            return 0
        clock = self.clock
        try:
            while True:
                total += 1
                if cq.status == e.IBV_WC_SUCCESS:
                    ts = clock.to_ns(int(cq.read_timestamp()))
                    on_wc(int(cq.wr_id), int(cq.read_byte_len()), int(cq.read_src_qp()), ts)
                else:
                    self.counters[f"wc_status_{cq.status}"] += 1
                if cq.poll_next() != 0:
                    break
        finally:
            cq.end_poll()
        return total

    def _poll_once(self) -> int:
        """Poll both CQs, time out, send what is due; return completions + datagrams sent."""
        events: list[ProbeEvent] = []

        def sent(slot: int, _len: int, _qp: int, ts: int) -> None:
            token = self._send_tokens.pop(slot, None)
            if token is not None:
                events.extend(self.session.on_tx_stamp(token, ts))

        def received(slot: int, byte_len: int, src_qp: int, ts: int) -> None:
            if not 0 <= slot < self._n_recv:
                self.counters["bad_wr_id"] += 1
                return
            mr = self._v["mr"]
            buf = mr.read(SLOT, slot * SLOT)
            try:
                grh, payload = split_grh(buf, byte_len)
                src = (grh_source(grh), src_qp)
            except PacketError:
                self.counters["bad_packet"] += 1
            else:
                events.extend(self.session.receive(payload, src, ts, self.now_ns()))
            self._post_recv(slot)

        work = self._poll(self._v["scq"], sent) + self._poll(self._v["rcq"], received)
        events.extend(self.session.poll(self.now_ns()))
        for _ in range(2):  # the second round: FOLLOW_UPs queued by host stamps
            for dgram in self.session.next_datagrams(self.now_ns()):
                events.extend(self.send(dgram))
                work += 1
        if events and self.on_events is not None:
            if self.wire_sport:
                events = rewrite_sports(events, self.wire_sport)
            self.on_events(events)
        return work

    def wake(self) -> None:
        """Tell `run` the session has new work."""
        self._wake.set()

    async def run(self) -> None:
        """Poll both CQs and the session until `close`.

        Every `poll_interval_s` while there is work (completions, sends, queued or pending
        probes); when idle the interval doubles up to `idle_poll_max_s` (a waiting responder
        costs ~8x less CPU; on "sw" stamps its first receive after a quiet spell is stamped up
        to that much late). `wake` and any work bring the fast interval back.
        """
        interval = self.poll_interval_s
        while not self._closed:
            work = self._poll_once()
            self._wake.clear()
            if work or self.session.next_deadline_ns() is not None:
                interval = self.poll_interval_s
            else:
                interval = min(2 * interval, max(self.idle_poll_max_s, self.poll_interval_s))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()


class _AgentLike(Protocol):
    publisher: Publisher


class RdmaEndpointFactory:
    """The agent's endpoint factory for the RDMA transport (a `prober.endpoint.EndpointFactory`),
    with one shared peer table.

    Every NIC gets a `prober.session.ProbeSession` on an `RdmaEndpoint` (the Python rules: the
    compiled engine is UDP's); no path discovery (no TTL-limited traces over verbs) and no
    shared ticks. `agent_tasks` (called by the agent once its endpoints are open) announces
    the local QPs in the presence document and returns the presence follower that fills the
    table.
    """

    def __init__(self, cfg: ProberConfig) -> None:
        self.cfg = cfg
        self.peers = RdmaPeerTable()
        self.endpoints: list[RdmaEndpoint] = []

    @property
    def hot_path(self) -> str:
        """Return the hot path of the RDMA endpoints (`session_hot_path`, never compiled)."""
        return session_hot_path(self.cfg, built=False)

    def __call__(
        self,
        nic: NicConfig,
        codec: Codec,
        sports: Sequence[int],
        on_events: Callable[[list[ProbeEvent]], None],
    ) -> NicTransport:
        """Return the (not yet opened) session and endpoint of ``nic``; `RdmaUnavailable`
        without a device."""
        if not nic.rdma_device:
            raise RdmaUnavailable(f"NIC {nic.id} has no rdma_device in {self.cfg.source}")
        session = ProbeSession(nic.id, codec, timeout_ns=self.cfg.timeout_ms * 1_000_000)
        ep = RdmaEndpoint(session, nic, sports=sports, on_events=on_events, peers=self.peers)
        self.endpoints.append(ep)
        return NicTransport(ep)

    def port_usable(self, nic_id: str, port: int) -> bool:
        """Return True: an RDMA source port is a flow label or a QP's, nothing to bind."""
        return True

    def presence_block(self) -> dict[str, dict[str, Any]]:
        """Return the presence ``rdma`` block of the opened endpoints."""
        from prober.rdma.peers import presence_rdma

        return presence_rdma(ep.local_address(self.cfg.host) for ep in self.endpoints if ep.qpn)

    def on_change(self, changed: frozenset[str]) -> None:
        """Refresh the address handles of the changed peer NICs on every local endpoint."""
        for ep in self.endpoints:
            for nic in sorted(changed):
                ep.refresh_peer(nic)

    def agent_tasks(self, agent: _AgentLike) -> list[Coroutine[Any, Any, None]]:
        """Announce the local QPs in presence; return the presence follower coroutine."""
        from prober.rdma.presence import follow_presence

        agent.publisher.set_presence_rdma(self.presence_block())
        client_id = f"qpmesh-peers-{self.cfg.host}"
        return [follow_presence(self.cfg.mqtt, client_id, self.peers, self.on_change)]


def rdma_endpoint_factory(cfg: ProberConfig) -> RdmaEndpointFactory:
    """Return the agent's endpoint factory for the RDMA transport."""
    return RdmaEndpointFactory(cfg)
