"""Prober configuration: one TOML file, validated into frozen values.

Every problem becomes one `ConfigError` (a ValueError: the CLI exits 2) whose message names
the file and the key, e.g. ``prober.toml: mqtt.port: must be an integer in 1..65535, got 0``.
Unknown keys are errors too (a typo must not silently fall back to a default). The reads are
`contract.tomlcheck`'s, the same as the controller's and the scenario files'.

Layout (see docs/prober.md for the full reference)::

    [prober]                      # host = "host0", transport = "udp", port = 4791, ...
    [schedule]                    # rate_hz, paths, confidence, cross_peers, coded, seed
    [mqtt]                        # host, port, prefix, keepalive_s, timeout_s, backoff_*,
                                  # tls, ca_file, cert_file, key_file, username, password_file
    [nats]                        # servers, subject_prefix, timeouts, backoff_*, TLS keys of
                                  # [mqtt]: probe batches go to JetStream (docs/scale.md)
    [spool]                       # max_batches, max_bytes, dir
    [telemetry]                   # interval_s, gpu
    [signals]                     # interval_s: hardware-signal windows (0 = off; default 10)
    [paths]                       # enabled, traces_per_s, max_ttl, refresh_s (path discovery)
    [auth]                        # key_file: probe HMAC keys (contract.keys; docs/security.md)
    [discover]                    # nics, exclude (globs), nic_id, lldp_socket, lldp_interval_s,
                                  # peers: this host's NICs and its peers found, not listed
    [[nics]]   id, address, group, device, rdma_device, gid_index
    [[peers]]  id, address, group, port

Discovery (`read_discover`) is on when the file has ``[discover]`` or no ``[[nics]]``: the
prober then finds its NICs (`prober.discover.resolve.discover_config`, before it starts) and
learns its peers from the other probers' neighbours documents; ``[[nics]]`` and ``[[peers]]``
entries override what is found. ``prober.host`` defaults to the host name. So a config needs
only ``[mqtt]`` (the broker and its credentials).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from contract.connection import read_link
from contract.keys import HMAC, KeySet, load_key_file
from contract.tomlcheck import Table, parse_toml
from mqttlink.settings import BrokerSettings
from natslink.settings import NatsSettings, read_nats
from natslink.subjects import SubjectError, check_token
from prober.discover.nics import nic_id as make_nic_id
from prober.schedule import ScheduleConfig

TRANSPORTS = ("udp", "rdma")
STAMPS = ("auto", "hw", "sw")
HOT_PATHS = ("compiled", "batched", "per-datagram")


class ConfigError(ValueError):
    """The prober configuration is invalid; the message names the file and key."""


@dataclass(frozen=True, slots=True)
class NicConfig:
    """A local NIC: its fabric ``id``, IP ``address`` it probes from, ECMP ``group`` (leaf).

    ``device``: netdev name for sysfs counters (optional); ``rdma_device``: verbs device
    (e.g. ``mlx5_0``) for the RDMA transport; ``gid_index``: RoCEv2 GID index.
    """

    id: str
    address: str
    group: str = "group0"
    device: str = ""
    rdma_device: str = ""
    rdma_port: int = 1
    gid_index: int = 3


@dataclass(frozen=True, slots=True)
class PeerConfig:
    """A NIC this host may probe: fabric ``id``, ``address``, ``group``, probe ``port``."""

    id: str
    address: str
    group: str = "group0"
    port: int = 0  # 0: the local prober.port


@dataclass(frozen=True, slots=True)
class DiscoverConfig:
    """``[discover]``: which interfaces to probe from (``nics`` = ``include`` and ``exclude``
    shell globs, `prober.discover.nics.NicFilter`), the fabric id of a found NIC (``nic_id``,
    ``{host}`` and ``{ifname}`` filled in), lldpd's control socket (``lldp_socket``, "" the
    system's), how often LLDP is read again (``lldp_interval_s``) and whether peers are
    learned from the other probers' neighbours documents (``peers``)."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    nic_id: str = "{host}.{ifname}"
    lldp_socket: str = ""
    lldp_interval_s: float = 10.0
    peers: bool = True


@dataclass(frozen=True, slots=True)
class ProberConfig:
    """The whole validated configuration."""

    host: str
    nics: tuple[NicConfig, ...]
    peers: tuple[PeerConfig, ...]
    transport: str = "udp"
    port: int = 4791
    timestamps: str = "auto"
    hot_path: str = "compiled"  # UDP: "compiled" (prober.compiled), "batched" (prober.fastudp)
    # or "per-datagram" (prober.udp); see docs/prober.md
    timeout_ms: int = 1000
    batch_interval_ms: int = 1000
    tick_ms: int = 10  # the compiled path's shared timer (prober.drive); see docs/prober.md
    defer_follow_ups: bool = True  # compiled path: t3s ride in later replies (prober.wire)
    tick_batch: bool = True  # compiled path: one C call per tick for all NICs (prober.drive)
    follow_up_hold_ms: int = 250  # ... or leave as one FOLLOW_UP after this; < timeout_ms / 2
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    mqtt: BrokerSettings = field(default_factory=BrokerSettings)
    # [nats]: probe batches go to JetStream (natslink); None: over MQTT with the rest
    nats: NatsSettings | None = None
    spool_max_batches: int = 10_000
    spool_max_bytes: int = 64 << 20
    spool_dir: str = ""
    telemetry_interval_s: float = 5.0
    telemetry_gpu: bool = True
    signals_interval_s: float = 10.0  # [signals]: a SignalsDoc window this often (0: none)
    paths_enabled: bool = True
    paths_traces_per_s: float = 5.0
    paths_max_ttl: int = 8
    paths_refresh_s: float = 60.0
    auth_key_file: str = ""  # "" = probes are not authenticated; relative: to the config file
    discover: DiscoverConfig | None = None  # [discover]: NICs and peers found (None: listed)
    source: str = "<config>"

    def group_of(self) -> dict[str, str]:
        """Return NIC id -> ECMP group for every known NIC (local and peers)."""
        out = {p.id: p.group for p in self.peers}
        out.update({n.id: n.group for n in self.nics})
        return out

    def peer_address(self) -> dict[str, tuple[str, int]]:
        """Return NIC id -> (address, port) for every known NIC."""
        out = {p.id: (p.address, p.port or self.port) for p in self.peers}
        out.update({n.id: (n.address, self.port) for n in self.nics})
        return out


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _ident(value: str) -> bool:
    return bool(value) and all(c.isalnum() or c in "-_.:" for c in value)


def _port(v: int) -> bool:
    return 1 <= v <= 0xFFFF


def parse_config(
    doc: Mapping[str, Any],
    source: str = "<config>",
    base_dir: Path | None = None,
    hostname: Callable[[], str] = socket.gethostname,
) -> ProberConfig:
    """Return the validated configuration in TOML document ``doc``; raise `ConfigError`.

    Relative file names in ``[mqtt]`` and ``[nats]`` (``ca_file``, ``cert_file``, ``key_file``,
    ``password_file``) are taken from ``base_dir`` (the config file's folder).
    ``prober.host`` defaults to ``hostname()``.
    """
    src = source
    root = Table.root(doc, src, ConfigError)
    pr = root.table("prober")
    want = "a host id (letters, digits, - _ . :)"
    host = pr.get("host", str, "", _ident, want) or hostname()
    if not _ident(host):
        raise pr.err("host", f"is not set and the host name {host!r} is not {want}")
    transport = pr.get("transport", str, "udp", lambda v: v in TRANSPORTS, f"one of {TRANSPORTS}")
    port = pr.get("port", int, 4791, _port, "an integer in 1..65535")
    stamps = pr.get("timestamps", str, "auto", lambda v: v in STAMPS, f"one of {STAMPS}")
    hot_path = pr.get("hot_path", str, "compiled", lambda v: v in HOT_PATHS, f"one of {HOT_PATHS}")
    timeout_ms = pr.get("timeout_ms", int, 1000, lambda v: 1 <= v <= 60_000, "1..60000")
    batch_ms = pr.get("batch_interval_ms", int, 1000, lambda v: 10 <= v <= 600_000, "10..600000")
    tick_ms = pr.get("tick_ms", int, 10, lambda v: 1 <= v <= 100, "1..100")
    defer_fu = pr.get("defer_follow_ups", bool, True)
    tick_batch = pr.get("tick_batch", bool, True)
    hold_ms = pr.get("follow_up_hold_ms", int, min(250, timeout_ms // 4),
                     lambda v: 0 <= v <= timeout_ms // 2,
                     f"0..{timeout_ms // 2} (half of timeout_ms: held t3s must arrive in time)")  # fmt: skip
    pr.finish()
    schedule = read_schedule(root.table("schedule"))
    mqtt = read_mqtt(root.table("mqtt"), base_dir)
    nats = read_nats(na := root.table("nats"), base_dir)
    na.finish()
    if nats is not None:
        try:
            check_token(host, "host")
        except SubjectError as exc:
            raise ConfigError(f"{src}: prober.host: with [nats]: {exc}") from None

    sp = root.table("spool")
    max_batches = sp.get("max_batches", int, 10_000, lambda v: v >= 1, "a positive integer")
    max_bytes = sp.get("max_bytes", int, 64 << 20, lambda v: v >= 1024, "an integer >= 1024")
    spool_dir = sp.get("dir", str, "")
    sp.finish()

    te = root.table("telemetry")
    tel_interval = te.get("interval_s", float, 5.0, lambda v: 0.1 <= v <= 3600, "0.1..3600")
    tel_gpu = te.get("gpu", bool, True)
    te.finish()

    si = root.table("signals")
    sig_interval = si.get("interval_s", float, 10.0, lambda v: v == 0 or 1 <= v <= 3600,
                          "0 (off) or 1..3600")  # fmt: skip
    si.finish()

    pa = root.table("paths")
    paths_enabled = pa.get("enabled", bool, True)
    traces = pa.get("traces_per_s", float, 5.0, lambda v: 0 < v <= 1000, "in (0, 1000]")
    max_ttl = pa.get("max_ttl", int, 8, lambda v: 1 <= v <= 64, "1..64")
    refresh = pa.get("refresh_s", float, 60.0, lambda v: 1 <= v <= 86400, "1..86400")
    pa.finish()

    au = root.table("auth")
    key_file = au.get("key_file", str, "", bool, "a key file path (docs/security.md)")
    au.finish()

    nics = tuple(_read_nic(t) for t in root.tables("nics"))
    discover = None
    if root.has("discover") or not nics:
        discover = read_discover(root.table("discover"), host)
    peers = tuple(_read_peer(t) for t in root.tables("peers"))
    _check_unique_ids(nics, peers, src)
    root.finish()

    return ProberConfig(
        host=host,
        nics=nics,
        peers=peers,
        transport=transport,
        port=port,
        timestamps=stamps,
        hot_path=hot_path,
        timeout_ms=timeout_ms,
        batch_interval_ms=batch_ms,
        tick_ms=tick_ms,
        defer_follow_ups=defer_fu,
        tick_batch=tick_batch,
        follow_up_hold_ms=hold_ms,
        schedule=schedule,
        mqtt=mqtt,
        nats=nats,
        spool_max_batches=max_batches,
        spool_max_bytes=max_bytes,
        spool_dir=spool_dir,
        telemetry_interval_s=tel_interval,
        telemetry_gpu=tel_gpu,
        signals_interval_s=sig_interval,
        paths_enabled=paths_enabled,
        paths_traces_per_s=traces,
        paths_max_ttl=max_ttl,
        paths_refresh_s=refresh,
        auth_key_file=key_file,
        discover=discover,
        source=src,
    )


def read_discover(tab: Table, host: str) -> DiscoverConfig:
    """Return ``[discover]`` (`DiscoverConfig`; an empty table: every interface with an RDMA
    port, ids ``{host}.{ifname}``, the system lldpd). Raises the table's error, also for an
    ``nic_id`` template that does not make a fabric id for ``host``."""
    d = DiscoverConfig()

    def globs(key: str) -> tuple[str, ...]:
        value = tab.get(key, list, [], lambda v: all(isinstance(x, str) and x.strip() for x in v),
                        "a list of interface name globs")  # fmt: skip
        return tuple(value)

    out = DiscoverConfig(
        include=globs("nics"),
        exclude=globs("exclude"),
        nic_id=tab.get("nic_id", str, d.nic_id),
        lldp_socket=tab.get("lldp_socket", str, d.lldp_socket),
        lldp_interval_s=tab.get(
            "lldp_interval_s", float, d.lldp_interval_s, lambda v: 0.1 <= v <= 3600, "0.1..3600"
        ),
        peers=tab.get("peers", bool, d.peers),
    )
    try:
        make_nic_id(out.nic_id, host, "eth0")
    except ValueError as exc:
        raise tab.err("nic_id", str(exc)) from None
    tab.finish()
    return out


def read_schedule(tab: Table) -> ScheduleConfig:
    """Return the probe schedule of ``[schedule]`` (``rate_hz``, ``paths``, ``confidence``,
    ``cross_peers``, ``coded``, ``jitter``, ``seed``); raises the table's error."""
    kw: dict[str, Any] = {
        "rate_hz": tab.get("rate_hz", float, 10.0, lambda v: 0 < v <= 1e5, "a rate in (0, 1e5]"),
        "paths": tab.get("paths", int, 16, lambda v: 1 <= v <= 4096, "an integer in 1..4096"),
        "confidence": tab.get("confidence", float, 0.9, lambda v: 0 < v < 1, "in (0, 1)"),
        "cross_peers": tab.get("cross_peers", int, 16, lambda v: 0 <= v <= 1024, "0..1024"),
        "coded": tab.get("coded", bool, True),
        "jitter": tab.get("jitter", float, 0.25, lambda v: 0 <= v < 0.5, "in [0, 0.5)"),
        "seed": tab.get("seed", int, 0),
    }
    tab.finish()
    try:
        return ScheduleConfig(**kw)
    except ValueError as exc:
        raise tab.error(f"{tab.source}: schedule: {exc}") from None


def read_mqtt(tab: Table, base_dir: Path | None) -> BrokerSettings:
    """Return the broker settings of ``[mqtt]`` (``host``, ``port``, ``prefix``,
    ``keepalive_s`` and the keys every broker's table has, `contract.connection.read_link`:
    ``timeout_s``, ``backoff_min_s``, ``backoff_max_s``, TLS and credentials, files relative
    to ``base_dir``);
    raises the table's error."""
    kw: dict[str, Any] = {
        "host": tab.get("host", str, "127.0.0.1", bool, "a host name or address"),
        "port": tab.get("port", int, 1883, _port, "an integer in 1..65535"),
        "prefix": tab.get("prefix", str, "qpmesh/v1"),
        "keepalive_s": tab.get("keepalive_s", int, 10, lambda v: 1 <= v <= 3600, "1..3600"),
        **read_link(tab, base_dir),
    }
    tab.finish()
    try:
        return BrokerSettings(**kw)
    except ValueError as exc:
        raise tab.error(f"{tab.source}: mqtt: {exc}") from None


def _read_nic(tab: Table) -> NicConfig:
    """Return one ``[[nics]]`` entry."""
    nic = NicConfig(
        id=tab.require("id", str, _ident, "a NIC id"),
        address=tab.require("address", str, _is_ip, "an IP address"),
        group=tab.get("group", str, "group0", _ident, "a group id"),
        device=tab.get("device", str, ""),
        rdma_device=tab.get("rdma_device", str, ""),
        rdma_port=tab.get("rdma_port", int, 1, lambda v: 1 <= v <= 255, "1..255"),
        gid_index=tab.get("gid_index", int, 3, lambda v: 0 <= v <= 255, "0..255"),
    )
    tab.finish()
    return nic


def _read_peer(tab: Table) -> PeerConfig:
    """Return one ``[[peers]]`` entry."""
    peer = PeerConfig(
        id=tab.require("id", str, _ident, "a NIC id"),
        address=tab.require("address", str, _is_ip, "an IP address"),
        group=tab.get("group", str, "group0", _ident, "a group id"),
        port=tab.get("port", int, 0, lambda v: 0 <= v <= 0xFFFF, "0..65535"),
    )
    tab.finish()
    return peer


def _check_unique_ids(nics: tuple[NicConfig, ...], peers: tuple[PeerConfig, ...], src: str) -> None:
    """Raise `ConfigError` for the first NIC id given twice (local NICs, then peers)."""
    seen: set[str] = set()
    ids = [("nics", i, n.id) for i, n in enumerate(nics)]
    ids += [("peers", i, p.id) for i, p in enumerate(peers)]
    for kind, i, nic_id in ids:
        if nic_id in seen:
            raise ConfigError(f"{src}: {kind}[{i}].id: duplicate NIC id {nic_id!r}")
        seen.add(nic_id)


def load_config(path: Path | str) -> ProberConfig:
    """Read and validate the TOML file at ``path``; a relative ``auth.key_file`` is made
    relative to the file's directory (the key file itself is read by `load_probe_keys`).

    Raises `ConfigError` for bad TOML or bad values, `OSError` if the file cannot be read.
    """
    p = Path(path)
    cfg = parse_config(parse_toml(p.read_bytes(), str(p), ConfigError), str(p), p.parent)
    if cfg.auth_key_file and not Path(cfg.auth_key_file).is_absolute():
        cfg = replace(cfg, auth_key_file=str(p.parent / cfg.auth_key_file))
    return cfg


def load_probe_keys(cfg: ProberConfig) -> KeySet | None:
    """Return the probe keys ``cfg`` names (None: no ``[auth] key_file``).

    Raises `contract.keys.KeyFileError` (a ValueError, one line naming the file and what is
    wrong: missing, mode open to group/others, malformed; never the key material).
    """
    if not cfg.auth_key_file:
        return None
    return load_key_file(cfg.auth_key_file, HMAC)
