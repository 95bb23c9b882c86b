"""The controller's configuration: a TOML file -> a frozen, validated `ServiceConfig`.

Read through `contract.tomlcheck` (the same validator as the prober's and the scenario
files'): strict types, unknown sections and keys are errors, every error is one `ConfigError`
line naming the file and the key. The sections are listed at `load_config`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.keys import KeySet
from contract.tomlcheck import Table, parse_toml
from controller.api.config import TENANTS, ApiConfig, read_api_table, read_tenants
from controller.brain import BrainConfig
from controller.clocksolve import ClockSyncConfig
from controller.coalesce import CoalesceConfig
from controller.fleet.plane import Plane
from controller.live import LiveConfig
from controller.remediation.config import (
    RemediationConfig,
    load_action_keys,
    read_action_key_file,
    read_remediation,
)
from controller.tenancy import Grants, TenancyError
from controller.timeseries.config import TimeseriesConfig, read_metrics, read_timeseries
from controller.topology import LearnConfig
from mesh.fabric import Fabric, FabricError, FabricShape, build_fabric
from mesh.fabric.learn import switch_id
from mqttlink.settings import MqttSecurity, read_security
from natslink.settings import NatsSettings, read_nats
from natslink.subjects import SubjectError, check_token


class ConfigError(ValueError):
    """The controller configuration is invalid (one-line message)."""


@dataclass(frozen=True)
class ServiceConfig:
    """Everything the service needs, validated. With ``learn`` the fabric is learned
    (`controller.topology`) and ``fabric`` is where it starts: empty."""

    fabric: Fabric
    live: LiveConfig = field(default_factory=LiveConfig)
    brain: BrainConfig = field(default_factory=BrainConfig)
    tick_s: float = 1.0
    backoff_s: tuple[float, float] = (0.5, 30.0)
    router_nodes: Mapping[str, str] = field(default_factory=dict)
    model_paths: bool = True  # False: flows without a discovered path have unknown hops
    timeseries: TimeseriesConfig | None = None  # [timeseries]; None = not written
    metrics_listen: str | None = None  # [metrics] listen: Prometheus scrape address
    api: ApiConfig | None = None  # [api]: serve /api/v1/ (controller.api.config)
    # [api.tenants]: the NICs each tenant may see and run jobs on, checked against the fabric
    # (controller.tenancy); they bind jobs from MQTT too, so they hold without an API
    grants: Grants = field(default_factory=Grants)
    # [remediation]: the policy, Control at start, webhooks (controller.remediation.config);
    # without the table the policy runs with its defaults and Control off ("would have")
    remediation: RemediationConfig = field(default_factory=RemediationConfig)
    mqtt_security: MqttSecurity = field(default_factory=MqttSecurity)  # [mqtt]: TLS, login
    # [mqtt] session / session_expiry_s: a persistent session under this client id (the
    # broker keeps the controller's subscriptions and queues its batches while it restarts
    # or reconnects; one controller per id); "": a clean session each connect
    mqtt_session: str = ""
    mqtt_session_expiry_s: int = 600
    # [auth] action_key_file: the Ed25519 key that signs remediation actions (contract.keys,
    # read at load; repr shows key ids only); None: actions go out unsigned (a warning)
    action_keys: KeySet | None = None
    # [ingest]: probe batches arriving within coalesce_ms are ingested merged (controller.coalesce)
    ingest: CoalesceConfig = field(default_factory=CoalesceConfig)
    # [fabric] without shape keys or a file: the fabric is learned (controller.topology)
    learn: LearnConfig | None = None
    nats: NatsSettings | None = None  # [nats]: the servers of the fleet's data plane
    fleet: FleetShellConfig | None = None  # [fleet]: workers + solver on NATS (docs/scale.md)


EMPTY_FABRIC = Fabric((), (), ())
"""Where a learned fabric starts: nothing is known until the probers report."""


@dataclass(frozen=True)
class FleetShellConfig:
    """``[fleet]``: the data plane (`controller.fleet.plane.Plane`) and this process's
    ``member`` id in it (a worker's or solver's lease owner; "" = the command picks
    ``<hostname>-<pid>``)."""

    plane: Plane = field(default_factory=Plane)
    member: str = ""


def load_config(path: Path | None, base_dir: Path | None = None) -> ServiceConfig:
    """Read and validate a TOML config (None = defaults: a learned fabric).

    Sections: ``[fabric]`` (`read_fabric` when it has shape keys or ``file``, else
    `read_learning`: the fabric is learned, with or without a plan), ``[sync]`` (`read_sync`), ``[controller]``
    (``tick_s``, ``stale_s``, ``max_events``: `read_controller`), ``[ingest]``
    (`read_ingest`), ``[thresholds]`` (the detection `BrainConfig`, nested tables for its
    parameter groups), ``[paths]`` (`read_paths`), ``[timeseries]`` and ``[metrics]``
    (`controller.timeseries.config`, docs/timeseries.md), ``[api]`` and ``[api.tenants]``
    (`controller.api.config`, docs/api.md; the tenants' grants are built here, against the
    fabric: `read_grants`), ``[remediation]`` and ``[auth]`` (`controller.remediation.config`,
    docs/recovery.md, docs/security.md), ``[mqtt]`` (TLS and credentials: ``tls``,
    ``ca_file``, ``cert_file``, ``key_file``, ``username``, ``password_file``;
    `mqttlink.settings.read_security`; ``session`` and ``session_expiry_s``: a persistent
    session; the broker's address is the command's ``--broker``),
    ``[nats]`` (`natslink.settings.read_nats`) and ``[fleet]`` (`read_fleet`: the sharded
    controller, docs/scale.md; needs ``[nats]``).
    The service's own tables are read here, the others beside what they configure, all
    through `contract.tomlcheck`: types are strict (``use_uncoded = "false"`` is an error, not True), relative file names
    are taken from ``base_dir`` (default: the file's folder). Raises `ConfigError` (one line
    naming the file and the key) on anything invalid.
    """
    root = _root(path)
    if path is not None:
        base_dir = base_dir or path.parent
    fab = root.table("fabric")
    learn = read_learning(fab, base_dir) if learns(fab) else None
    fabric = read_fabric(fab, base_dir) if learn is None else EMPTY_FABRIC
    sync = read_sync(root.table("sync"))
    live, tick_s = read_controller(root.table("controller"), sync)
    ingest = read_ingest(root.table("ingest"))
    routers, model_paths = read_paths(root.table("paths"), None if learn else fabric)
    brain = root.table("thresholds").dataclass(BrainConfig())
    timeseries = read_timeseries(root.table("timeseries"), base_dir)
    metrics_listen = read_metrics(root.table("metrics"))
    api_tab = root.table("api")
    grants = read_grants(api_tab, fabric)
    api = read_api_table(api_tab, base_dir)
    remediation = read_remediation(root.table("remediation"), base_dir)
    mqtt_security, session, expiry = _read_mqtt(root.table("mqtt"), base_dir)
    nats = read_nats(na := root.table("nats"), base_dir)
    na.finish()
    fleet = read_fleet(fl := root.table("fleet"), live.window_ns)
    if fleet is not None and nats is None:
        raise ConfigError(f"{fl.source}: fleet: needs a [nats] table (its servers)")
    if fleet is not None and learn is not None and fleet.plane.edge_owners:
        raise ConfigError(f"{fl.source}: fleet: edge_owners need a declared fabric ([fabric] "
                          "shape keys or file): edge owners do not follow a learned one")  # fmt: skip
    key_file = read_action_key_file(root.table("auth"), base_dir)
    root.finish()
    return ServiceConfig(
        fabric=fabric,
        live=live,
        brain=brain,
        tick_s=tick_s,
        router_nodes=routers,
        model_paths=model_paths,
        timeseries=timeseries,
        metrics_listen=metrics_listen,
        api=api,
        grants=grants,
        remediation=remediation,
        mqtt_security=mqtt_security,
        mqtt_session=session,
        mqtt_session_expiry_s=expiry,
        action_keys=load_action_keys(key_file, ConfigError),
        ingest=ingest,
        learn=learn,
        nats=nats,
        fleet=fleet,
    )


def read_fleet(tab: Table, window_ns: int) -> FleetShellConfig | None:
    """Return ``[fleet]`` (None when absent) on the windows of ``window_ns`` (the
    controller's tick, ``[controller] tick_s``: the fleet grid): ``partitions`` (equal to the
    servers' ``partition(n,1)`` mapping), ``grace_s`` (the workers' lateness),
    ``solver_wait_s``, ``lease_ttl_s``, ``replicas``, ``max_age_s``, ``max_bytes``,
    ``duplicate_window_s``, ``chunk_bytes``, ``fetch_batch``, ``edge_owners`` (0..1024: the
    edge owners, `controller.fleet.ownerloop`), ``edge_wait_s``, ``id``
    (`controller.fleet.plane.Plane`, docs/scale.md). Raises the table's error."""
    if not tab.values:
        return None
    d = Plane()
    kw: dict[str, Any] = {
        "partitions": tab.get("partitions", int, d.partitions, lambda v: 1 <= v <= 1024, "1..1024"),
        "window_ns": window_ns,
        "grace_ns": _ns(tab, "grace_s", d.grace_ns, lambda v: v >= 0, "a number of s >= 0"),
        "solver_wait_ns": _ns(
            tab, "solver_wait_s", d.solver_wait_ns, lambda v: v >= 0, "a number of s >= 0"
        ),
        "lease_ttl_s": tab.get(
            "lease_ttl_s",
            float,
            d.lease_ttl_s,
            lambda v: 1 <= v <= 600,
            "a number of s in [1, 600]",
        ),
        "replicas": tab.get("replicas", int, d.replicas, lambda v: 1 <= v <= 5, "1..5"),
        "max_age_s": tab.get("max_age_s", float, d.max_age_s, lambda v: v > 0, _POS),
        "max_bytes": tab.get("max_bytes", int, d.max_bytes, lambda v: v > 0, "an integer > 0"),
        "duplicate_window_s": tab.get(
            "duplicate_window_s", float, d.duplicate_window_s, lambda v: v > 0, _POS
        ),
        "chunk_bytes": tab.get(
            "chunk_bytes", int, d.chunk_bytes, lambda v: v > 0, "an integer > 0"
        ),
        "fetch_batch": tab.get(
            "fetch_batch", int, d.fetch_batch, lambda v: v > 0, "an integer > 0"
        ),
        "edge_owners": tab.get(
            "edge_owners", int, d.edge_owners, lambda v: 0 <= v <= 1024, "0..1024"
        ),
        "edge_wait_ns": _ns(
            tab, "edge_wait_s", d.edge_wait_ns, lambda v: v >= 0, "a number of s >= 0"
        ),
    }
    member = tab.get("id", str, "")
    tab.finish()
    try:
        if member:
            check_token(member, "fleet id")
        return FleetShellConfig(Plane(**kw), member)
    except (ValueError, SubjectError) as exc:
        raise tab.error(f"{tab.source}: fleet: {exc}") from None


def _root(path: Path | None) -> Table:
    """Return the top table of the file at ``path`` (an empty one for None)."""
    if path is None:
        return Table.root({}, "<defaults>", ConfigError)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    return Table.root(parse_toml(text, str(path), ConfigError), str(path), ConfigError)


def read_fabric(tab: Table, base_dir: Path | None) -> Fabric:
    """Return the fabric of ``[fabric]``: its shape keys (`FabricShape`), or ``file = F``
    (a fabric JSON, relative to ``base_dir``), not both. Raises the table's error."""
    where = f"{tab.source}: fabric"
    if not tab.has("file"):
        try:
            return build_fabric(tab.dataclass(FabricShape()))
        except FabricError as exc:
            raise tab.error(f"{where}: {exc}") from None
    fpath = Path(tab.require("file", str))
    if set(tab.values) - {"file"}:
        raise tab.error(f"{where}: takes either file or shape keys, not both")
    return _fabric_file(tab, fpath, base_dir)


def learns(tab: Table) -> bool:
    """Return True when ``[fabric]`` (``tab``) asks for a learned fabric: it has neither
    shape keys nor ``file`` (an absent table included)."""
    declared = {f.name for f in dataclasses.fields(FabricShape)} | {"file"}
    return not declared & set(tab.values)


def read_learning(tab: Table, base_dir: Path | None) -> LearnConfig:
    """Return how the fabric is learned, from ``[fabric]`` without shape keys or a file:
    ``plan`` (a fabric file, relative to ``base_dir``, that every learned change is checked
    against), ``relearn_s`` (at most one relearn this often, default 2), ``path_max_age_s``
    (a flow's path not traced again for this long is forgotten, default 600) and
    ``[fabric.routers]`` (router address -> switch name for spines and super-spines, else
    named by their router ids). Raises the table's error."""
    d = LearnConfig()
    plan = None
    if tab.has("plan"):
        plan = _fabric_file(tab, Path(tab.require("plan", str, bool, "a fabric file")), base_dir)
    relearn = _ns(tab, "relearn_s", d.relearn_ns, lambda v: 0 <= v <= 3600, "0..3600")
    max_age = _ns(tab, "path_max_age_s", d.path_max_age_ns, lambda v: 1 <= v <= 86400, "1..86400")
    names = tab.mapping("routers", str, "a switch name")
    for addr, name in names.items():
        if switch_id(name) != name or not name:
            raise tab.err(
                f"routers.{addr}", f"must be a switch name (no / + # or blanks), got {name!r}"
            )
    tab.finish()
    return LearnConfig(plan=plan, names=names, relearn_ns=relearn, path_max_age_ns=max_age)


def _fabric_file(tab: Table, fpath: Path, base_dir: Path | None) -> Fabric:
    """Return the fabric in JSON file ``fpath`` (relative to ``base_dir``); raise the
    table's error naming the file."""
    if not fpath.is_absolute() and base_dir is not None:
        fpath = base_dir / fpath
    try:
        return Fabric.from_dict(json.loads(fpath.read_text()))
    except OSError as exc:
        raise tab.error(f"cannot read fabric file {fpath}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise tab.error(f"fabric file {fpath}: bad JSON: {exc}") from None
    except FabricError as exc:
        raise tab.error(f"fabric file {fpath}: {exc}") from None


_POS = "a number > 0"


def _finite(v: float) -> bool:
    return 0 < v < float("inf")


def _ns(tab: Table, key: str, default_ns: int, check: Callable[[float], bool], want: str) -> int:
    """Return the duration ``key`` (given in s) in ns."""
    return int(tab.get(key, float, default_ns / 1e9, check, want) * 1e9)


def read_sync(tab: Table) -> ClockSyncConfig:
    """Return the clock sync settings of ``[sync]``: ``window_s``, ``solve_every_s``,
    ``min_solve_every_s``, ``solve_budget``, ``coded_tol_ns``, ``coded_tol_hw_ns``,
    ``quant_hw_ns``, ``bins``, ``use_uncoded``, and the clock-trust gate's ``max_unc_ns``,
    ``coarse_unc_ns``, ``min_span_s``, ``warmup_bins`` (docs/controller.md, "Clock trust");
    unset keys keep the pipeline's defaults (one solve per window). Raises the table's error,
    also for what `ClockSyncConfig` rejects across keys (a 0 ns window, ...)."""
    d = ClockSyncConfig()
    try:
        sync = ClockSyncConfig(
            window_ns=_ns(tab, "window_s", d.window_ns, lambda v: v > 0, _POS),
            solve_every_ns=_ns(tab, "solve_every_s", d.solve_every_ns, lambda v: v > 0, _POS),
            min_solve_every_ns=_ns(
                tab, "min_solve_every_s", d.min_solve_every_ns, lambda v: v > 0, _POS
            ),
            solve_budget=tab.get(
                "solve_budget", float, d.solve_budget, lambda v: 0 < v <= 1, "a number in (0, 1]"
            ),
            coded_tol_ns=tab.get(
                "coded_tol_ns", int, d.coded_tol_ns, lambda v: v >= 0, "an integer >= 0"
            ),
            coded_tol_hw_ns=tab.get(
                "coded_tol_hw_ns", int, d.coded_tol_hw_ns, lambda v: v >= 0, "an integer >= 0"
            ),
            quant_hw_ns=tab.get(
                "quant_hw_ns", float, d.quant_hw_ns, lambda v: 0 <= v < 1e6,
                "a number of ns in [0, 1e6)",
            ),
            bins=tab.get("bins", int, d.bins, lambda v: 1 <= v <= 1024, "an integer in 1..1024"),
            use_uncoded=tab.get("use_uncoded", bool, d.use_uncoded),
            max_unc_ns=tab.get("max_unc_ns", float, d.max_unc_ns, _finite, "a number of ns > 0"),
            coarse_unc_ns=tab.get(
                "coarse_unc_ns", float, d.coarse_unc_ns, _finite, "a number of ns > 0"
            ),
            min_span_ns=_ns(
                tab, "min_span_s", d.min_span_ns, lambda v: 0 <= v < 1e9, "a number of s >= 0"
            ),
            warmup_bins=tab.get(
                "warmup_bins", int, d.warmup_bins, lambda v: 1 <= v <= 1024,
                "an integer in 1..1024",
            ),
        )  # fmt: skip
    except ValueError as exc:
        if isinstance(exc, tab.error):
            raise
        raise tab.error(f"{tab.source}: sync: {exc}") from None
    tab.finish()
    return sync


def read_controller(tab: Table, sync: ClockSyncConfig) -> tuple[LiveConfig, float]:
    """Return the live state's settings (``stale_s``, ``max_events``, with ``sync``; the
    detection windows of the fleet grid are one tick long) and the tick in s (``tick_s``) of
    ``[controller]``. Raises the table's error."""
    stale_ns = _ns(tab, "stale_s", 10_000_000_000, lambda v: v > 0, _POS)
    max_events = tab.get("max_events", int, 200, lambda v: v > 0, "an integer > 0")
    tick_s = tab.get("tick_s", float, 1.0, lambda v: v > 0, _POS)
    live = LiveConfig(
        sync=sync, stale_ns=stale_ns, max_events=max_events, window_ns=max(1, round(tick_s * 1e9))
    )
    tab.finish()
    return live, tick_s


def read_ingest(tab: Table) -> CoalesceConfig:
    """Return ``[ingest]``: ``coalesce_ms``, ``max_records`` (`controller.coalesce`)."""
    d = CoalesceConfig()
    ingest = CoalesceConfig(
        coalesce_ms=tab.get(
            "coalesce_ms", float, d.coalesce_ms, lambda v: 0 <= v <= 1000, "a number in [0, 1000]"
        ),
        max_records=tab.get(
            "max_records", int, d.max_records, lambda v: 1 <= v <= 1 << 22,
            "an integer in [1, 4194304]",
        ),
    )  # fmt: skip
    tab.finish()
    return ingest


def read_paths(tab: Table, fabric: Fabric | None) -> tuple[dict[str, str], bool]:
    """Return ``[paths]``: ``routers`` (router address -> fabric node id, to map the probers'
    discovered paths onto fabric links) and ``model`` (False: the fabric model's ECMP hash is
    not authoritative, so flows without a discovered path get unknown hops). Raises the
    table's error, also for a router mapped to a node ``fabric`` lacks; ``fabric`` None (a
    learned fabric, which maps routers itself) takes no ``routers``."""
    model_paths = tab.get("model", bool, True)
    routers = tab.mapping("routers", str, "a fabric node id")
    if fabric is None and routers:
        raise tab.err("routers", "a learned fabric maps router addresses itself: name "
                      "switches in [fabric.routers] instead")  # fmt: skip
    known = fabric.node_by_id if fabric is not None else {}
    for addr, node in routers.items():
        if node not in known:
            raise tab.error(f"{tab.source}: paths.routers.{addr}: unknown fabric node {node!r}")
    tab.finish()
    return routers, model_paths


def read_grants(api: Table, fabric: Fabric) -> Grants:
    """Return the grants of ``[api.tenants]`` in ``api`` (the ``[api]`` table), checked
    against ``fabric`` (`controller.tenancy.Grants.build`); no table: no grants. Raises the
    table's error, one line naming ``api.tenants``."""
    try:
        return Grants.build(read_tenants(api), fabric)
    except TenancyError as exc:
        raise api.err(TENANTS, str(exc)) from None


def _read_mqtt(tab: Table, base_dir: Path | None) -> tuple[MqttSecurity, str, int]:
    """Return ``[mqtt]``: TLS and credentials (`mqttlink.settings.read_security`), the
    persistent session's client id ("": none) and its expiry (s)."""
    security = read_security(tab, base_dir)
    session = tab.get("session", str, "", _client_id_ok, "an MQTT client id (1-64 of A-Za-z0-9_.-)")
    expiry = tab.get("session_expiry_s", int, 600, lambda v: 1 <= v <= 86_400, "1 to 86400")
    tab.finish()
    return security, session, expiry


def _client_id_ok(value: str) -> bool:
    return 0 < len(value) <= 64 and all(c.isalnum() or c in "_.-" for c in value)
