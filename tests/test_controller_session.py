"""The controller's persistent MQTT session (issue 32, cause 1): ``[mqtt] session`` makes the
broker keep its subscriptions and queue its QoS 1 batches while it is away."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import aiomqtt
import pytest

from controller.config import ConfigError, load_config
from controller.service import session_kwargs


def test_the_session_keys_are_read_and_checked(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[mqtt]\n")
    assert session_kwargs(load_config(cfg)) == {}  # a clean session per connect
    cfg.write_text('[mqtt]\nsession = "qpmesh-controller-a"\nsession_expiry_s = 120\n')
    kw = session_kwargs(load_config(cfg))
    assert (kw["identifier"], kw["clean_start"]) == ("qpmesh-controller-a", False)
    assert kw["properties"].SessionExpiryInterval == 120
    for text, msg in (('session = "a b"', "session: must be an MQTT client id"),
                      ("session_expiry_s = 0", "session_expiry_s: must be 1 to 86400")):  # fmt: skip
        cfg.write_text(f"[mqtt]\n{text}\n")
        with pytest.raises(ConfigError, match=msg):
            load_config(cfg)


async def test_batches_published_while_the_controller_is_away_are_delivered(
    mosquitto: tuple[str, int], tmp_path: Path
) -> None:
    host, port = mosquitto
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[mqtt]\nsession = "qpmesh-ctl-{secrets.token_hex(4)}"\n')
    kw = session_kwargs(load_config(cfg))
    topic = f"qpmesh-test-{secrets.token_hex(4)}/probes/host1"
    v5 = aiomqtt.ProtocolVersion.V5
    async with aiomqtt.Client(host, port, protocol=v5, **kw) as ctl:
        await ctl.subscribe(topic, qos=1)
    async with aiomqtt.Client(host, port, protocol=v5) as prober:  # the controller is away
        for i in range(3):
            await prober.publish(topic, f"batch{i}".encode(), qos=1)
    got: list[bytes] = []
    async with aiomqtt.Client(host, port, protocol=v5, **kw) as ctl:  # back: no subscribe
        async with asyncio.timeout(5):
            async for msg in ctl.messages:
                got.append(bytes(msg.payload))  # type: ignore[arg-type]
                if len(got) == 3:
                    break
    assert got == [b"batch0", b"batch1", b"batch2"]
