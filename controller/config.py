"""The controller's configuration: a TOML file -> a frozen, validated `ServiceConfig`.

Read through `contract.tomlcheck` (the same validator as the prober's and the scenario
files'): strict types, unknown sections and keys are errors, every error is one `ConfigError`
line naming the file and the key. The sections are listed at `load_config`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.keys import ED25519_PRIVATE, KeyFileError, KeySet, load_key_file
from contract.tomlcheck import Table, parse_toml
from controller.api.config import ApiConfig, read_api_table
from controller.brain import BrainConfig
from controller.clocksync import ClockSyncConfig
from controller.coalesce import CoalesceConfig
from controller.live import LiveConfig
from controller.remediation.config import RemediationConfig, read_remediation
from controller.timeseries.config import TimeseriesConfig, read_metrics, read_timeseries
from mesh.fabric import Fabric, FabricError, FabricShape, build_fabric
from mqttlink.settings import MqttSecurity, read_security


class ConfigError(ValueError):
    """The controller configuration is invalid (one-line message)."""


@dataclass(frozen=True)
class ServiceConfig:
    """Everything the service needs, validated."""

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
    # [remediation]: the policy, Control at start, webhooks (controller.remediation.config);
    # without the table the policy runs with its defaults and Control off ("would have")
    remediation: RemediationConfig = field(default_factory=RemediationConfig)
    mqtt_security: MqttSecurity = field(default_factory=MqttSecurity)  # [mqtt]: TLS, login
    # [auth] action_key_file: the Ed25519 key that signs remediation actions (contract.keys,
    # read at load; repr shows key ids only); None: actions go out unsigned (a warning)
    action_keys: KeySet | None = None
    # [ingest]: probe batches arriving within coalesce_ms are ingested merged (controller.coalesce)
    ingest: CoalesceConfig = field(default_factory=CoalesceConfig)


def load_config(path: Path | None, base_dir: Path | None = None) -> ServiceConfig:
    """Read and validate a TOML config (None = defaults: a default-shaped fabric).

    Sections: ``[fabric]`` (shape keys of `FabricShape`, or ``file = "fabric.json"``),
    ``[sync]`` (``window_s``, ``solve_every_s``, ``min_solve_every_s``, ``solve_budget``,
    ``coded_tol_ns``, ``coded_tol_hw_ns``,
    ``quant_hw_ns``, ``bins``, ``use_uncoded``, and the
    clock-trust gate's ``max_unc_ns``, ``min_span_s``, ``warmup_bins``),
    ``[controller]`` (``tick_s``, ``stale_s``, ``max_events``), ``[ingest]``
    (``coalesce_ms``, ``max_records``: `controller.coalesce.CoalesceConfig`), ``[thresholds]`` (the
    detection `BrainConfig`, nested tables for its parameter groups), ``[paths]``
    (``routers``: router address -> fabric node id, to map the probers' discovered paths onto
    fabric links; ``model = false``: the fabric model's ECMP hash is not authoritative, so
    flows without a discovered path get unknown hops), ``[timeseries]`` and ``[metrics]``
    (`controller.timeseries.config`, docs/timeseries.md), ``[api]`` (`controller.api.config`,
    docs/api.md), ``[remediation]`` (`controller.remediation.config`, docs/recovery.md),
    ``[mqtt]`` (TLS and credentials: ``tls``, ``ca_file``, ``cert_file``, ``key_file``,
    ``username``, ``password_file``; `mqttlink.settings.read_security`; the broker's address
    is the command's ``--broker``), ``[auth]`` (``action_key_file``: the ``ed25519-private``
    key file that signs remediation actions, mode 0600, docs/security.md). Types are strict
    (`contract.tomlcheck`): ``use_uncoded = "false"`` is an error, not True. Raises
    `ConfigError` (one line naming the file and the key) on anything invalid.
    """
    src = str(path) if path is not None else "<defaults>"
    doc: dict[str, Any] = {}
    if path is not None:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
        doc = parse_toml(text, src, ConfigError)
        base_dir = base_dir or path.parent
    root = Table.root(doc, src, ConfigError)
    fab = root.table("fabric")
    if fab.has("file"):
        fpath = Path(fab.require("file", str))
        if not fpath.is_absolute() and base_dir is not None:
            fpath = base_dir / fpath
        if set(fab.values) - {"file"}:
            raise ConfigError(f"{src}: fabric: takes either file or shape keys, not both")
        try:
            fabric = Fabric.from_dict(json.loads(fpath.read_text()))
        except OSError as exc:
            raise ConfigError(f"cannot read fabric file {fpath}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"fabric file {fpath}: bad JSON: {exc}") from None
        except FabricError as exc:
            raise ConfigError(f"fabric file {fpath}: {exc}") from None
    else:
        try:
            fabric = build_fabric(fab.dataclass(FabricShape()))
        except FabricError as exc:
            raise ConfigError(f"{src}: fabric: {exc}") from None
    d = ClockSyncConfig()  # unset keys keep the pipeline's defaults (one solve per window)
    sy = root.table("sync")
    pos = "a number > 0"
    try:
        sync = ClockSyncConfig(
            window_ns=int(
                sy.get("window_s", float, d.window_ns / 1e9, lambda v: v > 0, pos) * 1e9
            ),
            solve_every_ns=int(
                sy.get("solve_every_s", float, d.solve_every_ns / 1e9, lambda v: v > 0, pos) * 1e9
            ),
            min_solve_every_ns=int(
                sy.get("min_solve_every_s", float, d.min_solve_every_ns / 1e9, lambda v: v > 0, pos)
                * 1e9
            ),
            solve_budget=sy.get(
                "solve_budget", float, d.solve_budget, lambda v: 0 < v <= 1, "a number in (0, 1]"
            ),
            coded_tol_ns=sy.get(
                "coded_tol_ns", int, d.coded_tol_ns, lambda v: v >= 0, "an integer >= 0"
            ),
            coded_tol_hw_ns=sy.get(
                "coded_tol_hw_ns", int, d.coded_tol_hw_ns, lambda v: v >= 0, "an integer >= 0"
            ),
            quant_hw_ns=sy.get(
                "quant_hw_ns", float, d.quant_hw_ns, lambda v: 0 <= v < 1e6,
                "a number of ns in [0, 1e6)",
            ),
            bins=sy.get("bins", int, d.bins, lambda v: 1 <= v <= 1024, "an integer in 1..1024"),
            use_uncoded=sy.get("use_uncoded", bool, d.use_uncoded),
            # the clock-trust gate (docs/controller.md, "Clock trust")
            max_unc_ns=sy.get(
                "max_unc_ns", float, d.max_unc_ns, lambda v: 0 < v < float("inf"),
                "a number of ns > 0",
            ),
            coarse_unc_ns=sy.get(
                "coarse_unc_ns", float, d.coarse_unc_ns, lambda v: 0 < v < float("inf"),
                "a number of ns > 0",
            ),
            min_span_ns=int(
                sy.get("min_span_s", float, d.min_span_ns / 1e9, lambda v: 0 <= v < 1e9,
                       "a number of s >= 0")
                * 1e9
            ),
            warmup_bins=sy.get(
                "warmup_bins", int, d.warmup_bins, lambda v: 1 <= v <= 1024,
                "an integer in 1..1024",
            ),
        )  # fmt: skip
    except ValueError as exc:  # cross-key checks of ClockSyncConfig (a 0 ns window, ...)
        raise ConfigError(f"{src}: sync: {exc}") from None
    sy.finish()
    co = root.table("controller")
    live = LiveConfig(
        sync=sync,
        stale_ns=int(co.get("stale_s", float, 10.0, lambda v: v > 0, pos) * 1e9),
        max_events=co.get("max_events", int, 200, lambda v: v > 0, "an integer > 0"),
    )
    tick_s = co.get("tick_s", float, 1.0, lambda v: v > 0, pos)
    co.finish()
    ig = root.table("ingest")
    dc = CoalesceConfig()
    ingest = CoalesceConfig(
        coalesce_ms=ig.get(
            "coalesce_ms", float, dc.coalesce_ms, lambda v: 0 <= v <= 1000, "a number in [0, 1000]"
        ),
        max_records=ig.get(
            "max_records", int, dc.max_records, lambda v: 1 <= v <= 1 << 22,
            "an integer in [1, 4194304]",
        ),
    )  # fmt: skip
    ig.finish()
    pa = root.table("paths")
    model_paths = pa.get("model", bool, True)
    routers = pa.mapping("routers", str, "a fabric node id")
    for addr, node in routers.items():
        if node not in fabric.node_by_id:
            raise ConfigError(f"{src}: paths.routers.{addr}: unknown fabric node {node!r}")
    pa.finish()
    brain = root.table("thresholds").dataclass(BrainConfig())
    timeseries = read_timeseries(root.table("timeseries"), base_dir)
    metrics_listen = read_metrics(root.table("metrics"))
    api = read_api_table(root.table("api"), base_dir)
    remediation = read_remediation(root.table("remediation"), base_dir) or RemediationConfig()
    mq = root.table("mqtt")
    mqtt_security = read_security(mq, base_dir)
    mq.finish()
    au = root.table("auth")
    action_key_file = au.get("action_key_file", str, "", bool, "a key file path")
    au.finish()
    root.finish()
    action_keys = None
    if action_key_file:
        kpath = Path(action_key_file)
        if not kpath.is_absolute() and base_dir is not None:
            kpath = base_dir / kpath
        try:  # KeyFileError: one line naming the file, never the key
            action_keys = load_key_file(kpath, ED25519_PRIVATE)
        except KeyFileError as exc:
            raise ConfigError(str(exc)) from None
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
        remediation=remediation,
        mqtt_security=mqtt_security,
        action_keys=action_keys,
        ingest=ingest,
    )
