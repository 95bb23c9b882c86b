"""``qpmesh controller``: run the controller service against an MQTT broker."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from contract.topics import DEFAULT_PREFIX, Topics
from mqttlink.settings import add_security_args, security_from_args

# the options of `add_security_args`; any of them given replaces the config's [mqtt] table
SECURITY_OPTIONS = (
    "mqtt_tls", "mqtt_ca", "mqtt_cert", "mqtt_key", "mqtt_user", "mqtt_password_file",
)  # fmt: skip

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


def _run(args: argparse.Namespace) -> int:
    from controller.config import load_config
    from controller.dispatch import JsonLog
    from controller.logrelay import relay_logging
    from controller.service import Broker, run_service

    host, port = parse_broker(args.broker)
    config = load_config(Path(args.config) if args.config else None)
    if any(getattr(args, k) for k in SECURITY_OPTIONS):  # the options replace [mqtt]
        config = dataclasses.replace(config, mqtt_security=security_from_args(args))
    broker = Broker(host, port, Topics(args.prefix), args.share)
    log_stream = open(args.log, "a") if args.log else sys.stderr  # noqa: SIM115
    log = JsonLog(log_stream)

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await run_service(broker, config, log=log)
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
        if args.log:
            log_stream.close()
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``qpmesh controller``."""
    p = sub.add_parser(
        "controller",
        help="run the controller: ingest probes from MQTT, sync clocks, detect, publish events",
        description="Subscribe to probe batches, presence and health on an MQTT broker; "
        "publish findings on <prefix>/events/<kind>; log JSON lines.",
    )
    p.add_argument("--broker", required=True, help="broker URL, mqtt://HOST:PORT")
    p.add_argument("--config", help="TOML config (fabric, sync, controller, thresholds)")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="topic prefix (default %(default)s)")
    p.add_argument("--share", help="shared-subscription group for probes (split load)")
    p.add_argument("--log", help="append JSON-lines log here (default stderr)")
    add_security_args(p)
    p.set_defaults(func=_run)
