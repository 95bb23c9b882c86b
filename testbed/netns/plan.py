"""Pure plan of an emulated leaf-spine fabric in Linux network namespaces.

`make_plan(fabric, prefix, ...)` turns the fabric model into data: the namespaces to create,
the veth pairs (with both ends created directly inside their namespaces, so only management
links carry the prefix in the root namespace), addresses, routes, qdiscs and sysctls, as
``ip -batch`` / ``tc -batch`` lines per namespace. Nothing here runs a command.

Layout (two-tier fabrics):

- namespace ``{prefix}{node}`` per host, leaf and spine (``qpm-host3``, ``qpm-leaf0``, ...);
- NIC link ``nicN-leafL``: interface ``nicN`` in the host namespace (the NIC's model address,
  /32) and interface ``nicN`` in the leaf namespace (gateway ``10.x.y.254``/32, same on every
  downlink of the leaf); per-NIC policy table so traffic from a NIC's address leaves by it;
  traffic between two NICs of one host leaves by the sender's NIC and comes back through the
  leaf (a rule per ordered pair, the local table moved after them, ``accept_local``);
- fabric link ``leafL-spineS``: interface ``spineS`` in the leaf namespace and ``leafL`` in the
  spine namespace, a /31 from 172.16.0.0/12 (leaf even, spine odd);
- leaves route ``10.0.0.0/8`` over all spines with one multipath route and L4 hashing
  (``fib_multipath_hash_policy=1``): the UDP source port picks the spine; spines route each
  leaf's /24 to that leaf;
- every link egress is shaped with tbf (both directions), so queues build at modest rates;
- management: a bridge ``{prefix}br`` in the root namespace with ``198.18-19.K.1/24`` and a veth
  per host (root side ``{prefix}hN``, host side ``mgmt``, address ``198.18-19.K.(N+2)``), so
  probers in the host namespaces reach a broker listening on the bridge address.

Two options for fabric learning (`mesh.fabric.learn`):

- ``router_ids``: every switch gets a router id, ``100.64.x.y/32`` on its ``lo``
  (`router_id`), its routes take it as preferred source and ICMP errors leave from it
  (``icmp_errors_use_inbound_ifaddr=0``): a TTL trace then names each switch by one address,
  as on a routed fabric whose switches source ICMP from a loopback. Off, a switch answers from
  the inbound interface's address (the default: ``testbed.runner.router_nodes`` maps those).
- ``lldp``: an lldpd runs in every namespace, hosts and switches (`testbed.netns.lldp`),
  announcing the node id as its system name.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from mesh.fabric import Fabric, FabricError, NodeKind

MAX_PREFIX_LEN = 8
MAX_MGMT_HOSTS = 250
MGMT_NETS = 512  # /24s inside 198.18.0.0/15
P2P_BASE = int(ipaddress.IPv4Address("172.16.0.0"))
ROUTER_ID_BASE = int(ipaddress.IPv4Address("100.64.0.0"))  # shared address space (RFC 6598)
NIC_TABLE_BASE = 100
SAME_HOST_RULE_PREF = 10  # rules "NIC a -> NIC b of the same host, via a's leaf" from here on
LOCAL_RULE_PREF = 999  # the local table, moved after those (and before the 1000+ NIC rules)
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]*-?$")


class PlanError(ValueError):
    """The fabric or the options cannot be laid out as namespaces (bad prefix, too large)."""


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if valid (lowercase letters/digits, optional trailing '-', <= 8 chars).

    Raises `PlanError` otherwise. The limit keeps root-namespace interface names <= 15 chars.
    """
    if not _PREFIX_RE.match(prefix) or len(prefix) > MAX_PREFIX_LEN:
        raise PlanError(
            f"bad prefix {prefix!r}: 1-{MAX_PREFIX_LEN} chars, lowercase letters/digits, "
            "optionally ending in '-'"
        )
    return prefix


def names_pattern(prefix: str) -> re.Pattern[str]:
    """Return the regex matching namespace and root link names a testbed with ``prefix`` made."""
    return re.compile(rf"^{re.escape(prefix)}(?:(?:host|leaf|spine)\d+|h\d+|br)$")


def mgmt_network(index: int) -> ipaddress.IPv4Network:
    """Return management /24 number ``index`` (0..511) inside 198.18.0.0/15."""
    if not 0 <= index < MGMT_NETS:
        raise PlanError(f"management network index must be in [0, {MGMT_NETS})")
    return ipaddress.IPv4Network((int(ipaddress.IPv4Address("198.18.0.0")) + 256 * index, 24))


@dataclass(frozen=True, slots=True)
class End:
    """One end of a link: namespace, interface name, address (CIDR or empty)."""

    ns: str
    ifname: str
    addr: str = ""


@dataclass(frozen=True, slots=True)
class LinkPlan:
    """A fabric link as a veth pair: lower end (host or leaf), upper end (leaf or spine)."""

    link_id: str
    lower: End
    upper: End
    rate_mbit: float


@dataclass(frozen=True)
class Plan:
    """Everything `apply` creates, as data; see the module docstring for the layout."""

    prefix: str
    namespaces: tuple[str, ...]
    node_ns: dict[str, str]
    links: dict[str, LinkPlan]
    nic_addr: dict[str, str]
    nic_host: dict[str, str]
    nic_gateway: dict[str, str]
    mgmt_bridge: str
    mgmt_addr: dict[str, str]  # host id -> address in the host namespace
    broker_addr: str
    root_lines: tuple[str, ...]
    ns_ip: dict[str, tuple[str, ...]]
    ns_tc: dict[str, tuple[str, ...]]
    ns_sysctl: dict[str, tuple[str, ...]]
    root_links: tuple[str, ...] = field(default=())
    router_ids: dict[str, str] = field(default_factory=dict)  # switch id -> router id
    lldp: bool = False  # an lldpd per namespace (testbed.netns.lldp)

    def link(self, link_id: str) -> LinkPlan:
        """Return the plan of link ``link_id``; raise `PlanError` if unknown."""
        try:
            return self.links[link_id]
        except KeyError:
            raise PlanError(f"unknown link {link_id!r}") from None

    def host_ns(self, host: str) -> str:
        """Return the namespace of host ``host``; raise `PlanError` if unknown."""
        ns = self.node_ns.get(host)
        if ns is None or not host.startswith("host"):
            raise PlanError(f"unknown host {host!r}")
        return ns

    def nic_end(self, nic: str) -> End:
        """Return the host-side end (namespace, interface) of NIC ``nic``; raise `PlanError`."""
        for lp in self.links.values():
            if lp.link_id.startswith(f"{nic}-"):
                return lp.lower
        raise PlanError(f"unknown NIC {nic!r}")


def router_id(switch_index: int) -> str:
    """Return the router id of the switch at ``switch_index`` in `Fabric.switches` order."""
    return str(ipaddress.IPv4Address(ROUTER_ID_BASE + switch_index + 1))


def _tbf(ifname: str, rate_mbit: float, latency_ms: float) -> str:
    burst = max(16_000, int(rate_mbit * 1e6 / 8 / 250))
    return (
        f"qdisc replace dev {ifname} root tbf rate {rate_mbit:g}mbit "
        f"burst {burst} latency {latency_ms:g}ms"
    )


def _p2p(link_index: int) -> tuple[str, str]:
    base = P2P_BASE + 2 * link_index
    return str(ipaddress.IPv4Address(base)), str(ipaddress.IPv4Address(base + 1))


def _leaf_net(nic_addr: str) -> str:
    return str(ipaddress.IPv4Network(f"{nic_addr}/24", strict=False))


def _gateway(nic_addr: str) -> str:
    return str(ipaddress.IPv4Network(f"{nic_addr}/24", strict=False)[254])


def make_plan(
    fabric: Fabric,
    prefix: str = "qpm-",
    *,
    fabric_rate_mbit: float = 100.0,
    nic_rate_mbit: float = 1000.0,
    latency_ms: float = 20.0,
    mgmt_index: int = 0,
    router_ids: bool = False,
    lldp: bool = False,
) -> Plan:
    """Return the `Plan` for ``fabric``; raise `PlanError` if it cannot be laid out.

    Two-tier fabrics only (super-spines are refused); at most 250 hosts (management /24).
    ``router_ids`` and ``lldp``: see the module doc.
    """
    check_prefix(prefix)
    if any(n.kind == NodeKind.SUPERSPINE for n in fabric.nodes):
        raise PlanError("the namespace testbed builds two-tier fabrics only (no super-spines)")
    if len(fabric.hosts) > MAX_MGMT_HOSTS:
        raise PlanError(f"at most {MAX_MGMT_HOSTS} hosts in a namespace testbed")
    if fabric_rate_mbit <= 0 or nic_rate_mbit <= 0 or latency_ms <= 0:
        raise PlanError("rates and latency must be > 0")
    node_ns = {n.id: f"{prefix}{n.id}" for n in fabric.nodes}
    namespaces = tuple(node_ns[n.id] for n in (*fabric.hosts, *fabric.switches))
    ip: dict[str, list[str]] = {ns: ["link set lo up"] for ns in namespaces}
    tc: dict[str, list[str]] = {ns: [] for ns in namespaces}
    sysctl: dict[str, list[str]] = {}
    root = [f"netns add {ns}" for ns in namespaces]
    links: dict[str, LinkPlan] = {}
    nic_addr = {n.id: n.address for n in fabric.nics}
    nic_gw = {n.id: _gateway(n.address) for n in fabric.nics}
    nic_host = {n.id: n.host for n in fabric.nics}
    rids = {sw.id: router_id(k) for k, sw in enumerate(fabric.switches)} if router_ids else {}
    for sw, rid in rids.items():
        ip[node_ns[sw]].append(f"addr add {rid}/32 dev lo")
    prefsrc = {sw: f" src {rid}" for sw, rid in rids.items()}  # routes' preferred source

    for lk in fabric.links:
        lower_ns, upper_ns = node_ns.get(lk.lower), node_ns[lk.upper]
        if lk.lower in nic_addr:  # NIC link: host namespace <-> leaf namespace
            nic = fabric.nic(lk.lower)
            lower = End(node_ns[nic.host], nic.id, f"{nic.address}/32")
            upper = End(upper_ns, nic.id, f"{nic_gw[nic.id]}/32")
            rate = nic_rate_mbit
        else:
            assert lower_ns is not None
            a, b = _p2p(lk.index)
            lower = End(lower_ns, lk.upper, f"{a}/31")
            upper = End(upper_ns, lk.lower, f"{b}/31")
            rate = fabric_rate_mbit
        links[lk.id] = LinkPlan(lk.id, lower, upper, rate)
        root.append(
            f"link add {lower.ifname} netns {lower.ns} type veth "
            f"peer name {upper.ifname} netns {upper.ns}"
        )
        for end in (lower, upper):
            ip[end.ns].append(f"addr add {end.addr} dev {end.ifname}")
            ip[end.ns].append(f"link set {end.ifname} up")
            tc[end.ns].append(_tbf(end.ifname, rate, latency_ms))

    # hosts: per-NIC policy routing, main table via the first NIC
    for host in fabric.hosts:
        ns = node_ns[host.id]
        sysctl[ns] = [
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
            "net.ipv4.icmp_ratelimit=0",  # port unreachable for every trace that gets there
        ]
        nics = fabric.nics_of_host(host.id)
        if len(nics) * (len(nics) - 1) > LOCAL_RULE_PREF - SAME_HOST_RULE_PREF:
            raise FabricError(f"host {host.id} has {len(nics)} NICs: at most 31 per host")
        if len(nics) > 1:
            # probes between two NICs of one host go through the leaf, as between RNICs on
            # a real fabric (the kernel would loop them through `lo`): a rule per ordered
            # pair for locally sent packets, the local table after those rules (before the
            # per-NIC `from` rules, which would forward an arriving one), and arriving
            # packets with a local source accepted
            sysctl[ns] += ["net.ipv4.conf.all.accept_local=1"]
            pair_pref = SAME_HOST_RULE_PREF
            for src in nics:
                for dst in nics:
                    if src.id != dst.id:
                        ip[ns].append(
                            f"rule add from {src.address} to {dst.address} iif lo "
                            f"lookup {NIC_TABLE_BASE + src.port} pref {pair_pref}"
                        )
                        pair_pref += 1
            ip[ns].append(f"rule add lookup local pref {LOCAL_RULE_PREF}")
            ip[ns].append("rule del lookup local pref 0")
        for k, nic in enumerate(nics):
            gw, table = nic_gw[nic.id], NIC_TABLE_BASE + nic.port
            ip[ns].append(f"route add 10.0.0.0/8 via {gw} dev {nic.id} onlink table {table}")
            ip[ns].append(f"rule add from {nic.address} lookup {table} pref {1000 + nic.port}")
            if k == 0:
                ip[ns].append(
                    f"route add 10.0.0.0/8 via {gw} dev {nic.id} onlink src {nic.address}"
                )
    # leaves: host routes down, ECMP multipath up; spines: leaf /24s down
    spines = [n for n in fabric.switches if n.kind == NodeKind.SPINE]
    for leaf in fabric.leaves:
        ns = node_ns[leaf.id]
        sysctl[ns] = _router_sysctls(router_ids)
        hops = []
        for sp in spines:
            lp = links.get(f"{leaf.id}-{sp.id}")
            if lp is None:
                raise FabricError(f"leaf {leaf.id} has no link to {sp.id}")
            hops.append(f"nexthop via {lp.upper.addr.split('/')[0]} dev {sp.id}")
        for nic in fabric.nics:
            if nic.leaf == leaf.id:
                via = prefsrc.get(leaf.id, f" src {nic_gw[nic.id]}")
                ip[ns].append(f"route add {nic.address}/32 dev {nic.id}{via}")
        ip[ns].append(f"route add 10.0.0.0/8{prefsrc.get(leaf.id, '')} " + " ".join(hops))
    for sp in spines:
        ns = node_ns[sp.id]
        sysctl[ns] = _router_sysctls(router_ids)
        for leaf in fabric.leaves:
            lp = links[f"{leaf.id}-{sp.id}"]
            nets = sorted({_leaf_net(n.address) for n in fabric.nics if n.leaf == leaf.id})
            for net in nets:
                ip[ns].append(
                    f"route add {net} via {lp.lower.addr.split('/')[0]} dev {leaf.id}"
                    + prefsrc.get(sp.id, "")
                )

    # management bridge in the root namespace
    mnet = mgmt_network(mgmt_index)
    bridge = f"{prefix}br"
    broker = str(mnet[1])
    root += [f"link add {bridge} type bridge", f"addr add {broker}/24 dev {bridge}"]
    root.append(f"link set {bridge} up")
    mgmt_addr: dict[str, str] = {}
    root_links = [bridge]
    for host in fabric.hosts:
        rname = f"{prefix}h{host.index}"
        ns = node_ns[host.id]
        mgmt_addr[host.id] = str(mnet[host.index + 2])
        root_links.append(rname)
        root += [
            f"link add {rname} type veth peer name mgmt netns {ns}",
            f"link set {rname} master {bridge}",
            f"link set {rname} up",
        ]
        ip[ns] += [f"addr add {mgmt_addr[host.id]}/24 dev mgmt", "link set mgmt up"]
    return Plan(
        prefix=prefix,
        namespaces=namespaces,
        node_ns=node_ns,
        links=links,
        nic_addr=nic_addr,
        nic_host=nic_host,
        nic_gateway=nic_gw,
        mgmt_bridge=bridge,
        mgmt_addr=mgmt_addr,
        broker_addr=broker,
        root_lines=tuple(root),
        ns_ip={k: tuple(v) for k, v in ip.items()},
        ns_tc={k: tuple(v) for k, v in tc.items()},
        ns_sysctl={k: tuple(v) for k, v in sysctl.items()},
        root_links=tuple(root_links),
        router_ids=rids,
        lldp=lldp,
    )


def _router_sysctls(router_ids: bool = False) -> list[str]:
    return [
        "net.ipv4.ip_forward=1",
        "net.ipv4.fib_multipath_hash_policy=1",
        "net.ipv4.conf.all.rp_filter=0",
        "net.ipv4.conf.default.rp_filter=0",
        "net.ipv4.icmp_ratemask=4120",  # do not rate-limit time-exceeded (path discovery)
        "net.ipv4.icmp_ratelimit=0",  # answer every TTL-expired trace probe
        # the answering address names the link, or (router ids) the switch
        f"net.ipv4.icmp_errors_use_inbound_ifaddr={0 if router_ids else 1}",
        # same multipath hash seed on every router: one flow hashes alike at both leaves, and
        # the (symmetric) hash sends a reply by the spine its probe took
        "?net.ipv4.fib_multipath_hash_seed=3141592",
    ]
