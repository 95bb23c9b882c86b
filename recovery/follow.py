"""The agent's MQTT side: follow the remediation topics of this rank's NICs, send acks, register.

A thin adapter on paho-mqtt's own network thread (training loops are not asyncio): actions
decoded from ``<prefix>/remediation/<nic>`` go into ``inbox`` (a `queue.Queue` the gloo shell
drains at safe points and while a collective is stuck) once `recovery.trust.ActionGate` has
admitted them (with a verify key: signed by the controller, not replayed, for this topic);
what it refuses is counted in ``gate.counters``, logged and dropped; `ack` publishes an `AckDoc` on ``<prefix>/remediation-ack/<id>`` (QoS 1). `register`
publishes the rank's NICs (`contract.remediation.RankDoc`), retained, on
``<prefix>/jobs/<job>/rank<k>`` (the controller's job registry reads it); `report`
publishes a `PerfDoc` (step time, collective timeouts) on ``.../rank<k>/perf``.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import Any

from contract.keys import KeySet
from contract.remediation import (
    DEFAULT_TENANT,
    AckDoc,
    PerfDoc,
    RankDoc,
    ack_topic,
    action_topic,
    perf_topic,
    rank_topic,
)
from mqttlink.settings import MqttSecurity, configure_paho
from recovery.trust import ActionGate

log = logging.getLogger("qpmesh.recovery")


__all__ = ["Follower", "rank_topic"]


class Follower:
    """Connects to the broker, follows ``nics``' action topics, publishes acks.

    ``security``: TLS and credentials (`mqttlink.settings.configure_paho`); with an ACL the
    agent's identity may read only its NICs' action topics (docs/mqtt-security.md). Raises
    OSError from `start` when the broker cannot be reached (an `ssl.SSLError` for TLS
    trouble), `mqttlink.settings.CredentialError` for an unreadable password file.
    """

    def __init__(self, host: str, port: int, nics: tuple[str, ...], inbox: queue.Queue[Any],
                 *, prefix: str = "qpmesh/v1", client_id: str = "",
                 security: MqttSecurity | None = None,
                 verify_keys: KeySet | None = None) -> None:  # fmt: skip
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.prefix, self.nics, self.inbox = prefix, nics, inbox
        self._topics = [action_topic(prefix, n) for n in nics]
        self._client: Any = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
        configure_paho(self._client, security or MqttSecurity())
        self._client.on_connect = self._on_connect
        self._client.on_message = self._on_message
        self.host, self.port = host, port
        self.received = 0
        # verify_keys (contract.keys ed25519-public): only actions the controller signed are
        # put in the inbox; replays, other topics' actions and forgeries are counted in
        # gate.counters and logged (recovery.trust.ActionGate)
        self.gate = ActionGate(verify_keys, prefix)
        if verify_keys is None:
            log.warning("no action verify key: remediation actions are believed unsigned")

    def _on_connect(self, client: Any, _u: Any, _f: Any, _rc: Any, _p: Any = None) -> None:
        for t in self._topics:
            client.subscribe(t, qos=1)

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        doc = self.gate.admit(str(msg.topic), msg.payload, time.time_ns())
        if doc is None:
            log.warning("dropped an action on %s: %s", msg.topic, self.gate.last_reason)
            return
        self.received += 1
        self.inbox.put(doc)

    def start(self) -> None:
        """Connect and start the network thread."""
        self._client.connect(self.host, self.port, keepalive=10)
        self._client.loop_start()

    def register(self, job: str, rank: int, host: str, nics: tuple[str, ...],
                 tenant: str = DEFAULT_TENANT) -> None:  # fmt: skip
        """Publish this rank's NICs (a `RankDoc`, retained; the controller's job registry
        reads it). Raises `DocumentError` on a bad job id, rank, NIC or tenant."""
        doc = RankDoc(job, rank, tuple(nics), host, tenant)
        self._client.publish(rank_topic(self.prefix, job, rank), doc.encode(), qos=1, retain=True)

    def report(self, doc: PerfDoc) -> None:
        """Publish a step-time report (`recovery.perf.StepMeter.report`) on the rank's perf
        topic (QoS 0: the next report supersedes a lost one)."""
        self._client.publish(perf_topic(self.prefix, doc.job, doc.rank), doc.encode(), qos=0)

    def ack(self, ack: AckDoc) -> None:
        """Publish ``ack`` on its action's ack topic."""
        self._client.publish(ack_topic(self.prefix, ack.action), ack.encode(), qos=1)

    def stop(self) -> None:
        """Disconnect and stop the network thread."""
        self._client.disconnect()
        self._client.loop_stop()
