"""What the agent drives per NIC, and the UDP transport's factory of it.

- `Endpoint`: one NIC's transport endpoint as the agent uses it (start, run, close, its clock,
  where to probe a peer, its `prober.session.Session`). Every endpoint type implements it:
  `prober.udp.UdpEndpoint` and its hot paths (`prober.fastudp.BatchUdpEndpoint`,
  `prober.compiled.CompiledUdpEndpoint`), `prober.pathdisc.TracingEndpoint` and
  `prober.rdma.transport.RdmaEndpoint` (mypy checks each where a factory returns it).
- `NicTransport`: what a factory made for one NIC: the endpoint, and what else its transport
  offers the agent: path discovery on the probe flows (``discovery``, UDP only) and a compiled
  endpoint the agent's `prober.drive.CompiledDriver` ticks in place of its `run` (``ticked``).
  The agent reads these two fields instead of asking which class an endpoint is.
- `EndpointFactory`: makes the session and endpoint of each NIC for one transport, and says
  which hot path they run, which source ports can be bound and which background tasks the
  transport needs. `UdpEndpointFactory` here; `prober.rdma.transport.RdmaEndpointFactory`.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prober import compiled
from prober.config import NicConfig, ProberConfig
from prober.events import Address, ProbeEvent
from prober.fastudp import BatchUdpEndpoint
from prober.pathdisc import PathDiscovery, PathTracer, TracingEndpoint
from prober.session import ProbeSession, Session
from prober.udp import UdpEndpoint, identity_clock
from prober.wire import Codec

TRACE_TIMEOUT_NS = 1_000_000_000
"""How long path discovery waits for a trace round's answers."""


class Endpoint(Protocol):
    """What the agent needs from a transport endpoint of one NIC (UDP or RDMA).

    ``start`` opens it (and warms it up; raises the transport's `OSError`); ``run`` is its
    timer loop until ``close`` (not started for an endpoint a driver ticks, see
    `NicTransport.ticked`); ``wake`` says the session has new work; ``now_ns`` is the NIC's
    clock (every stamp is in it); ``resolve`` says where to probe a peer NIC (UDP: its
    configured address; RDMA: the queue pair learnt from presence, None while unknown: the
    probe is skipped and counted, not lost); ``stamp_source`` is "hw" or "sw" (or "user").
    """

    @property
    def session(self) -> Session: ...
    @property
    def stamp_source(self) -> str: ...
    async def start(self) -> None: ...
    def close(self) -> None: ...
    async def run(self) -> None: ...
    def wake(self) -> None: ...
    def now_ns(self) -> int: ...
    def resolve(self, nic_id: str, configured: Address) -> Address | None: ...


@dataclass(frozen=True, slots=True)
class NicTransport:
    """What an `EndpointFactory` made for one NIC.

    ``endpoint``: what the agent starts, runs and queues through. ``discovery``: path
    discovery riding on the endpoint's probe flows (its trace results and ICMP errors are
    routed there), None when the transport cannot trace or ``[paths]`` is off. ``ticked``: the
    compiled endpoint (inside ``endpoint``) that a `prober.drive.CompiledDriver` ticks instead
    of ``endpoint.run``; None: the agent runs ``endpoint.run``.
    """

    endpoint: Endpoint
    discovery: PathDiscovery | None = None
    ticked: compiled.CompiledUdpEndpoint | None = None


class EndpointFactory(Protocol):
    """Makes the session and endpoint of each local NIC for one transport.

    ``hot_path``: the hot path its endpoints run (`session_hot_path`). Calling it returns the
    (not yet started) `NicTransport` of ``nic`` with a session using ``codec``, opening
    ``sports`` and handing results and losses to ``on_events``. ``port_usable(nic_id, port)``:
    whether a source port can be used now (the schedule skips the others). ``agent_tasks``:
    the transport's own background tasks once the endpoints are open (RDMA: announce the QPs,
    follow the peers' presence).
    """

    @property
    def hot_path(self) -> str: ...

    def __call__(
        self,
        nic: NicConfig,
        codec: Codec,
        sports: Sequence[int],
        on_events: Callable[[list[ProbeEvent]], None],
    ) -> NicTransport: ...

    def port_usable(self, nic_id: str, port: int) -> bool: ...

    def agent_tasks(self, agent: Any) -> list[Coroutine[Any, Any, None]]: ...


def session_hot_path(cfg: ProberConfig, built: bool) -> str:
    """Return the hot path the agent really runs for ``cfg``: ``"compiled"`` for the UDP
    transport with a built extension (``built``), probe HMAC on or off; a ``"compiled"``
    config falls back to ``"per-datagram"`` otherwise (RDMA, no compiler).

    Probe HMAC (``[auth] key_file``) does not change the choice: the C engine tags and
    verifies as `prober.wire.Codec` does (`prober.compiled`). An A/B against the Python path
    with authentication on is ``prober.hot_path = "per-datagram"``, the path authenticated
    probers ran before.
    """
    if cfg.hot_path != "compiled":
        return cfg.hot_path
    if cfg.transport == "udp" and built:
        return "compiled"
    return "per-datagram"


class UdpEndpointFactory:
    """The agent's endpoint factory for the UDP transport (no background tasks of its own).

    Per NIC, by ``hot_path``: a `prober.compiled.CompiledSession` on a
    `prober.compiled.CompiledUdpEndpoint` ticked by the agent's driver (``"compiled"``), or a
    `prober.session.ProbeSession` on a `prober.fastudp.BatchUdpEndpoint` (``"batched"``) or a
    `prober.udp.UdpEndpoint` (``"per-datagram"``, and the fallback of ``"compiled"``); wrapped
    in a `prober.pathdisc.TracingEndpoint` when ``[paths]`` is on.
    """

    def __init__(self, cfg: ProberConfig, clock: Callable[[int], int] | None = None) -> None:
        self.cfg = cfg
        # the one identity function: the compiled engine then maps no stamp through Python
        self.clock = clock if clock is not None else identity_clock
        # "auto" should try hardware stamps; until prober.timestamping.set_hw_timestamping's
        # ifreq packing is fixed (struct "=16sP" raises), only an explicit "hw" asks for them.
        self.want_hw = cfg.timestamps == "hw"
        self._hot_path = session_hot_path(cfg, compiled.available())

    @property
    def hot_path(self) -> str:
        """Return the hot path this factory's endpoints run."""
        return self._hot_path

    def __call__(
        self,
        nic: NicConfig,
        codec: Codec,
        sports: Sequence[int],
        on_events: Callable[[list[ProbeEvent]], None],
    ) -> NicTransport:
        """Return the (not yet started) session and UDP endpoint of ``nic`` (see the class)."""
        cfg = self.cfg
        timeout_ns = cfg.timeout_ms * 1_000_000
        kw: dict[str, Any] = {
            "device": nic.device or None, "dport": cfg.port, "sports": sports,
            "timestamping": True, "want_hw": self.want_hw, "on_events": on_events,
            "clock": self.clock,
        }  # fmt: skip
        ep: UdpEndpoint
        ticked: compiled.CompiledUdpEndpoint | None = None
        if self._hot_path == "compiled":
            session = compiled.CompiledSession(
                nic.id, codec, timeout_ns=timeout_ns, defer_follow_ups=cfg.defer_follow_ups,
                hold_ns=cfg.follow_up_hold_ms * 1_000_000,
            )  # fmt: skip
            # one `CompiledDriver` of the agent ticks every compiled NIC (`Agent.run`)
            ep = ticked = compiled.CompiledUdpEndpoint(session, nic.address, external_ticks=True,
                                                       **kw)  # fmt: skip
        else:
            cls = BatchUdpEndpoint if self._hot_path == "batched" else UdpEndpoint
            ep = cls(ProbeSession(nic.id, codec, timeout_ns=timeout_ns), nic.address, **kw)
        if not cfg.paths_enabled:
            return NicTransport(ep, None, ticked)
        tracing = TracingEndpoint(ep, PathTracer(TRACE_TIMEOUT_NS), cfg.paths_max_ttl, on_events)
        return NicTransport(tracing, tracing.discovery, ticked)

    def agent_tasks(self, agent: Any) -> list[Coroutine[Any, Any, None]]:
        """Return no tasks: UDP peers are configured, not discovered."""
        return []

    def port_usable(self, nic_id: str, port: int) -> bool:
        """Return whether UDP ``port`` can be bound on NIC ``nic_id``'s address now (another
        socket of the host may hold it: the RoCE source-port range overlaps Linux's ephemeral
        ports); True for a NIC this config does not have."""
        nic = next((n for n in self.cfg.nics if n.id == nic_id), None)
        if nic is None:
            return True
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind((nic.address, port))
            except OSError:
                return False
        return True


def udp_endpoint_factory(
    cfg: ProberConfig, clock: Callable[[int], int] | None = None
) -> UdpEndpointFactory:
    """Return the agent's factory of UDP endpoints per NIC, per the config.

    ``clock`` is the clock hook (kernel stamp ns -> host clock ns) every endpoint applies to
    its stamps; None is the identity (a real host). The namespace testbed passes a virtual
    clock per emulated host (``qpmesh testbed prober``); the prober knows nothing of it.
    """
    return UdpEndpointFactory(cfg, clock)
