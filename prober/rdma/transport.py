"""RDMA transport: one UD QP per NIC, completion-timestamped CQs, flow-label ECMP sweep.

Written against pyverbs (rdma-core ``tests/base.py`` / ``tests/utils.py`` patterns); needs a
verbs device, so it only runs on RDMA hardware (none here: the tests cover the pure parts,
`prober.rdma.flowlabel`, `prober.rdma.clock`, `prober.rdma.packet`).

Per NIC:

- ``Context(name=rdma_device)``, ``PD``, one ``MR`` holding a ring of receive slots (each
  40-byte GRH + message) and a send slot per outstanding send;
- two ``CQEX`` created with ``IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP``:
  the send completion's timestamp is t1/t3 (NIC clock), the receive completion's is t2/t4;
  raw cycles become ns with `HcaClock` (``hca_core_clock`` kHz from ``query_device_ex``,
  anchored by ``query_rt_values_ex``);
- one UD QP (qkey `QKEY`) that goes straight to RTS;
- one global address handle per (peer GID, source port): ``GlobalRoute(dgid, flow_label,
  sgid_index)`` with ``flow_label_for_sport(sport)`` so mlx5 puts ``sport`` in the RoCEv2 UDP
  header: the same port numbers the schedule sweeps with UDP.

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
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from prober.config import NicConfig, ProberConfig
from prober.events import Datagram, ProbeEvent
from prober.publish import Publisher
from prober.rdma.clock import HcaClock
from prober.rdma.discover import RdmaUnavailable
from prober.rdma.flowlabel import flow_label_for_sport
from prober.rdma.packet import GRH_SIZE, PacketError, grh_source, split_grh
from prober.rdma.peers import AhKey, PeerAddress, RdmaPeerTable, ah_plan, local_address
from prober.session import ProbeSession
from prober.wire import BODY_LEN, MAX_PAD, TAG_LEN

QKEY = 0x11111111
RECV_SLOTS = 512
SEND_SLOTS = 256
SLOT = GRH_SIZE + BODY_LEN + MAX_PAD + TAG_LEN


class RdmaEndpoint:
    """Carry one NIC's `ProbeSession` over a UD QP (same shape as `prober.udp.UdpEndpoint`)."""

    def __init__(
        self,
        session: ProbeSession,
        nic: NicConfig,
        *,
        sports: Sequence[int] = (),
        on_events: Callable[[list[ProbeEvent]], None] | None = None,
        poll_interval_s: float = 0.0005,
        peers: RdmaPeerTable | None = None,
    ) -> None:
        self.session = session
        self.nic = nic
        self.sports = tuple(sports)
        self.on_events = on_events
        self.poll_interval_s = poll_interval_s
        self.counters: Counter[str] = Counter()
        self.stamp_source = "hw"
        self.clock: HcaClock | None = None
        self.qpn = 0
        self.gid = ""
        self.peers = peers if peers is not None else RdmaPeerTable()
        self._v: Any = None  # pyverbs objects, created in open()
        self._ahs: dict[AhKey, Any] = {}
        self._retired: list[Any] = []  # AHs of changed peers; freed on close (sends may use them)
        self._peer_state: dict[str, PeerAddress] = {}  # what the AHs were made for
        self._qkeys: dict[tuple[str, int], int] = {}  # (gid, qpn) -> qkey of learnt peers
        self._send_tokens: dict[int, int] = {}
        self._next_send = 0
        self._closed = False
        self._wake = asyncio.Event()

    # ---- setup ----------------------------------------------------------------------------

    def open(self) -> None:
        """Create the verbs resources; raise `RdmaUnavailable` on any verbs error."""
        try:
            import pyverbs.enums as e
            from pyverbs.cq import CQEX, CqInitAttrEx
            from pyverbs.device import Context
            from pyverbs.mr import MR
            from pyverbs.pd import PD
            from pyverbs.pyverbs_error import PyverbsError
            from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
        except ImportError as exc:
            raise RdmaUnavailable(f"pyverbs unavailable: {exc}") from None
        try:
            ctx = Context(name=self.nic.rdma_device)
            attr_ex = ctx.query_device_ex()
            khz = int(attr_ex.hca_core_clock)
            mask = int(attr_ex.completion_timestamp_mask) or (1 << 64) - 1
            _, cycles = ctx.query_rt_values_ex()
            self.clock = HcaClock(khz, int(cycles) & mask, time.time_ns(), mask)
            pd = PD(ctx)
            flags = e.IBV_WC_STANDARD_FLAGS | e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
            scq = CQEX(ctx, CqInitAttrEx(cqe=SEND_SLOTS, wc_flags=flags))
            rcq = CQEX(ctx, CqInitAttrEx(cqe=RECV_SLOTS, wc_flags=flags))
            cap = QPCap(max_send_wr=SEND_SLOTS, max_recv_wr=RECV_SLOTS, max_send_sge=1,
                        max_recv_sge=1)  # fmt: skip
            init = QPInitAttr(qp_type=e.IBV_QPT_UD, scq=scq, rcq=rcq, cap=cap)
            qp_attr = QPAttr(port_num=self.nic.rdma_port)
            qp_attr.qkey = QKEY
            qp = QP(pd, init, qp_attr)
            mr = MR(pd, SLOT * (RECV_SLOTS + SEND_SLOTS), e.IBV_ACCESS_LOCAL_WRITE)
        except PyverbsError as exc:
            raise RdmaUnavailable(f"{self.nic.rdma_device}: {exc}") from None
        self.qpn = int(qp.qp_num)
        try:
            self.gid = str(ctx.query_gid(self.nic.rdma_port, self.nic.gid_index))
        except PyverbsError as exc:
            raise RdmaUnavailable(
                f"{self.nic.rdma_device}: GID {self.nic.gid_index}: {exc}"
            ) from None
        self._v = {"ctx": ctx, "pd": pd, "scq": scq, "rcq": rcq, "qp": qp, "mr": mr, "e": e}
        for slot in range(RECV_SLOTS):
            self._post_recv(slot)

    def close(self) -> None:
        """Release the verbs resources (idempotent)."""
        self._closed = True
        self._wake.set()
        if self._v is not None:
            for key in ("qp", "mr", "scq", "rcq", "pd", "ctx"):
                obj = self._v.get(key)
                if obj is not None:
                    obj.close()
            self._v = None
            self._ahs.clear()
            self._retired.clear()

    def _post_recv(self, slot: int) -> None:
        from pyverbs.wr import SGE, RecvWR

        mr = self._v["mr"]
        sge = SGE(mr.buf + slot * SLOT, SLOT, mr.lkey)
        self._v["qp"].post_recv(RecvWR(wr_id=slot, num_sge=1, sg=[sge]))

    def _create_ah(self, gid: str, sport: int) -> Any:
        from pyverbs.addr import AH, GID, AHAttr, GlobalRoute

        dgid = f"::ffff:{gid}" if "." in gid and ":" not in gid else gid  # RoCEv2 IPv4
        gr = GlobalRoute(dgid=GID(dgid), flow_label=flow_label_for_sport(sport) if sport else 0,
                         sgid_index=self.nic.gid_index, hop_limit=64)  # fmt: skip
        return AH(self._v["pd"], attr=AHAttr(port_num=self.nic.rdma_port, is_global=1, gr=gr))

    def _ah(self, gid: str, sport: int) -> Any:
        key = (gid, sport)
        ah = self._ahs.get(key)
        if ah is None:
            ah = self._ahs[key] = self._create_ah(gid, sport)
        return ah

    # ---- peers ----------------------------------------------------------------------------

    def local_address(self, host: str) -> PeerAddress:
        """Return this NIC's UD address for the presence document (after `open`)."""
        return local_address(host, self.nic.id, self.qpn, self.gid, QKEY, self.nic.rdma_port)

    def resolve(self, nic_id: str) -> tuple[str, int] | None:
        """Return the (gid, qpn) to probe NIC ``nic_id`` at; None (counted) while unknown."""
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
        for key in retire:
            ah = self._ahs.pop(key, None)
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
        """Return the NIC clock now (``query_rt_values_ex`` through the HCA clock)."""
        assert self.clock is not None and self._v is not None
        _, cycles = self._v["ctx"].query_rt_values_ex()
        return self.clock.to_ns(int(cycles))

    def send(self, dgram: Datagram) -> bool:
        """Post one UD send to ``dgram.dest = (gid, qpn)`` from the AH of its source port."""
        from pyverbs.wr import SGE, SendWR

        gid, qpn = dgram.dest
        slot = RECV_SLOTS + self._next_send % SEND_SLOTS
        self._next_send += 1
        mr = self._v["mr"]
        mr.write(dgram.data, len(dgram.data), slot * SLOT)
        wr = SendWR(wr_id=slot, opcode=self._v["e"].IBV_WR_SEND, num_sge=1,
                    sg=[SGE(mr.buf + slot * SLOT, len(dgram.data), mr.lkey)])  # fmt: skip
        qkey = self._qkeys.get((str(gid), int(qpn)), QKEY)
        try:
            wr.set_wr_ud(self._ah(str(gid), dgram.meta.sport), int(qpn), qkey)
            self._v["qp"].post_send(wr)
        except Exception as exc:  # PyverbsRDMAError: queue full, bad AH
            self.counters[f"send_error_{type(exc).__name__}"] += 1
            return False
        if dgram.meta.wants_tx_stamp:
            self._send_tokens[slot] = dgram.meta.token
        return True

    def _poll(self, cq: Any, on_wc: Callable[[int, int, int, int], None]) -> None:
        from pyverbs.cq import PollCqAttr

        e = self._v["e"]
        if cq.start_poll(PollCqAttr()) != 0:
            return
        try:
            while True:
                if cq.status == e.IBV_WC_SUCCESS:
                    on_wc(int(cq.wr_id), int(cq.read_byte_len()), int(cq.read_src_qp()),
                          int(cq.read_timestamp()))  # fmt: skip
                else:
                    self.counters[f"wc_status_{cq.status}"] += 1
                if cq.poll_next() != 0:
                    break
        finally:
            cq.end_poll()

    def _poll_once(self) -> None:
        assert self.clock is not None
        events: list[ProbeEvent] = []
        clock = self.clock

        def sent(slot: int, _len: int, _qp: int, ts: int) -> None:
            token = self._send_tokens.pop(slot, None)
            if token is not None:
                events.extend(self.session.on_tx_stamp(token, clock.to_ns(ts)))

        def received(slot: int, byte_len: int, src_qp: int, ts: int) -> None:
            mr = self._v["mr"]
            buf = mr.read(SLOT, slot * SLOT)
            try:
                grh, payload = split_grh(buf, byte_len)
                src = (grh_source(grh), src_qp)
            except PacketError:
                self.counters["bad_packet"] += 1
            else:
                events.extend(self.session.receive(payload, src, clock.to_ns(ts), self.now_ns()))
            self._post_recv(slot)

        self._poll(self._v["scq"], sent)
        self._poll(self._v["rcq"], received)
        events.extend(self.session.poll(self.now_ns()))
        for dgram in self.session.next_datagrams(self.now_ns()):
            self.send(dgram)
        if events and self.on_events is not None:
            self.on_events(events)

    def wake(self) -> None:
        """Tell `run` the session has new work."""
        self._wake.set()

    async def run(self) -> None:
        """Poll both CQs and the session until `close` (busy-ish polling, interval-bounded)."""
        while not self._closed:
            self._poll_once()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_interval_s)


class _AgentLike(Protocol):
    publisher: Publisher


class RdmaEndpointFactory:
    """The agent's endpoint factory for the RDMA transport, with one shared peer table.

    `agent_tasks` (called by the agent once its endpoints are open) announces the local QPs
    in the presence document and returns the presence follower that fills the table.
    """

    def __init__(self, cfg: ProberConfig) -> None:
        self.cfg = cfg
        self.peers = RdmaPeerTable()
        self.endpoints: list[RdmaEndpoint] = []

    def __call__(
        self,
        nic: NicConfig,
        session: ProbeSession,
        sports: Sequence[int],
        on_events: Callable[[list[ProbeEvent]], None],
    ) -> RdmaEndpoint:
        """Return a (not yet opened) endpoint of ``nic``; `RdmaUnavailable` without a device."""
        if not nic.rdma_device:
            raise RdmaUnavailable(f"NIC {nic.id} has no rdma_device in {self.cfg.source}")
        ep = RdmaEndpoint(session, nic, sports=sports, on_events=on_events, peers=self.peers)
        self.endpoints.append(ep)
        return ep

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
