"""``qpmesh controller``: run the controller service against an MQTT broker (with ``[fleet]``
in its config: the fleet's solver); ``qpmesh controller worker``: one of the fleet's ingest
workers on NATS JetStream; ``qpmesh controller owner``: one of its edge owner processes
(docs/scale.md)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from contract.topics import DEFAULT_PREFIX, Topics
from mqttlink.settings import add_security_args, security_from_args

# the options of `add_security_args`; any of them given replaces the config's [mqtt] table
SECURITY_OPTIONS = (
    "mqtt_tls", "mqtt_ca", "mqtt_cert", "mqtt_key", "mqtt_user", "mqtt_password_file",
)  # fmt: skip

if TYPE_CHECKING:
    from controller.dispatch import JsonLog
    from controller.live import LiveController

# The controller's modules (sync, scipy) load inside the command: every qpmesh command, a
# prober starting on a GPU host included, builds this parser.


def parse_broker(url: str) -> tuple[str, int]:
    """Return (host, port) of ``mqtt://HOST[:PORT]``; raises `ConfigError`."""
    from controller.config import ConfigError

    parts = urlsplit(url)
    if parts.scheme != "mqtt" or not parts.hostname:
        raise ConfigError(f"broker must look like mqtt://HOST:PORT, got {url!r}")
    try:
        port = parts.port or 1883
    except ValueError:
        raise ConfigError(f"bad broker port in {url!r}") from None
    return parts.hostname, port


def _serve(log_path: str | None, body: Callable[[JsonLog], Awaitable[object]]) -> int:
    """Run ``body(log)`` until SIGTERM/SIGINT, logging JSON lines to ``log_path`` (stderr)."""
    from controller.dispatch import JsonLog
    from controller.logrelay import relay_logging

    log_stream = open(log_path, "a") if log_path else sys.stderr  # noqa: SIM115
    log = JsonLog(log_stream)

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await body(log)
        except asyncio.CancelledError:
            log(time.time_ns(), "stopped")

    def python_log(level: str, logger: str, text: str) -> None:
        log(time.time_ns(), "python log", level=level, logger=logger, detail=text)

    try:
        with relay_logging(python_log):  # aiomqtt's, aiohttp's, asyncio's records: JSON lines
            asyncio.run(main())
    except KeyboardInterrupt:
        return 0
    finally:
        if log_path:
            log_stream.close()
    return 0


def _member(configured: str, option: str | None) -> str:
    """Return this process's fleet id: ``--id``, else ``[fleet] id``, else hostname-pid."""
    from natslink.subjects import check_token

    name = option or configured or f"{socket.gethostname().split('.')[0]}-{os.getpid()}"
    return check_token(name, "fleet id")


def _run(args: argparse.Namespace) -> int:
    from controller.config import ConfigError, load_config
    from controller.service import Broker, run_service

    if not args.broker:
        raise ConfigError("qpmesh controller needs --broker mqtt://HOST:PORT")
    host, port = parse_broker(args.broker)
    config = load_config(Path(args.config) if args.config else None)
    if any(getattr(args, k) for k in SECURITY_OPTIONS):  # the options replace [mqtt]
        config = dataclasses.replace(config, mqtt_security=security_from_args(args))
    broker = Broker(host, port, Topics(args.prefix))
    fleet_core = None
    if config.fleet is not None:  # the fleet's solver
        from controller.fleet.compose import SolverCore, service_core

        fleet = dataclasses.replace(config.fleet, member=_member(config.fleet.member, args.id))
        config = dataclasses.replace(config, fleet=fleet)

        def fleet_core(live: LiveController) -> SolverCore:
            return service_core(live, fleet.plane)

    return _serve(args.log, lambda log: run_service(broker, config, log=log,
                                                   fleet_core=fleet_core))  # fmt: skip


def _worker(args: argparse.Namespace) -> int:
    from controller.config import ConfigError, load_config
    from controller.fleet.compose import worker_cores
    from controller.fleet.edges import owner_bounds
    from controller.fleet.fabricwire import FabricFollow
    from controller.fleet.ownershare import OwnerCut
    from controller.fleet.workerloop import WorkerLoop

    config = load_config(Path(args.config))
    if config.fleet is None or config.nats is None:
        raise ConfigError(f"{args.config}: a worker needs [fleet] and [nats] tables")
    plane, nats = config.fleet.plane, config.nats
    member = _member(config.fleet.member, args.id)
    follow = FabricFollow() if config.learn is not None else None  # the solver's versions
    cores = worker_cores(config, plane, follow)

    def loop(log: JsonLog) -> Awaitable[None]:
        worker = WorkerLoop(plane, nats, member, cores, log=log, fabric=follow)
        if plane.edge_owners:  # owners need a declared fabric (the config refuses a learned)
            worker.use_owners(OwnerCut(owner_bounds(len(config.fabric.nics), plane.edge_owners)))
        return worker.run()

    return _serve(args.log, loop)


def _owner(args: argparse.Namespace) -> int:
    from controller.config import ConfigError, load_config
    from controller.fleet.compose import owner_cores
    from controller.fleet.ownerloop import OwnerLoop

    config = load_config(Path(args.config))
    if config.fleet is None or config.nats is None:
        raise ConfigError(f"{args.config}: an edge owner needs [fleet] and [nats] tables")
    plane, nats = config.fleet.plane, config.nats
    if plane.edge_owners < 1:
        raise ConfigError(f"{args.config}: an edge owner needs [fleet] edge_owners >= 1")
    member = _member(config.fleet.member, args.id)
    cores = owner_cores(config, plane)
    return _serve(args.log, lambda log: OwnerLoop(plane, nats, member, cores, log=log).run())


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``qpmesh controller``."""
    p = sub.add_parser(
        "controller",
        help="run the controller: ingest probes from MQTT, sync clocks, detect, publish events",
        description="Subscribe to probe batches, presence and health on an MQTT broker; "
        "publish findings on <prefix>/events/<kind>; log JSON lines.",
    )
    p.add_argument("--broker", help="broker URL, mqtt://HOST:PORT (required)")
    p.add_argument("--config", help="TOML config (fabric, sync, controller, thresholds; "
                   "[nats] + [fleet]: the fleet's solver, docs/scale.md)")  # fmt: skip
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="topic prefix (default %(default)s)")
    p.add_argument("--log", help="append JSON-lines log here (default stderr)")
    p.add_argument("--id", help="with [fleet]: this solver's lease id (default [fleet] id, "
                   "else HOSTNAME-PID)")  # fmt: skip
    add_security_args(p)
    p.set_defaults(func=_run)
    roles = p.add_subparsers(dest="role", metavar="ROLE")
    w = roles.add_parser(
        "worker",
        help="one of the fleet's ingest workers (NATS JetStream, docs/scale.md)",
        description="Own partitions of the probe batches through KV leases, ingest them and "
        "send one partial per partition and window to the solver.",
    )
    w.add_argument("--config", required=True, help="TOML config with [nats] and [fleet]")
    w.add_argument("--id", help="this worker's lease id (default [fleet] id, else HOSTNAME-PID)")
    w.add_argument("--log", help="append JSON-lines log here (default stderr)")
    w.set_defaults(func=_worker)
    o = roles.add_parser(
        "owner",
        help="one of the fleet's edge owner processes (NATS JetStream, docs/scale.md)",
        description="Hold [fleet] edge_owners indices through KV leases, fold each window's "
        "kept clock pairs of their edges and send the solver one summary block per index "
        "and solve window.",
    )
    o.add_argument("--config", required=True, help="TOML config with [nats] and [fleet]")
    o.add_argument("--id", help="this owner's lease id (default [fleet] id, else HOSTNAME-PID)")
    o.add_argument("--log", help="append JSON-lines log here (default stderr)")
    o.set_defaults(func=_owner)
