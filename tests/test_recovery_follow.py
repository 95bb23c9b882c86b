"""The agent's MQTT follower against a real mosquitto: actions in, malformed dropped, acks out."""

from __future__ import annotations

import json
import queue
import time
from typing import Any

import pytest

from contract.remediation import AckDoc, ActionDoc, action_topic
from recovery.follow import Follower, rank_topic

pytestmark = pytest.mark.broker


def _client(host: str, port: int, topics: list[str], got: queue.Queue[Any]) -> Any:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="test-operator")
    c.on_connect = lambda cl, *_: [cl.subscribe(t, 1) for t in topics]
    c.on_message = lambda _c, _u, m: got.put((m.topic, m.payload, m.retain))
    c.connect(host, port)
    c.loop_start()
    return c


def _wait(q: queue.Queue[Any], timeout: float = 10.0) -> Any:
    return q.get(timeout=timeout)


def test_follower_delivers_its_nics_actions_and_publishes_acks(mosquitto: tuple[str, int]) -> None:
    host, port = mosquitto
    inbox: queue.Queue[Any] = queue.Queue()
    f = Follower(host, port, ("nic0", "nic1"), inbox, client_id="t-follower")
    seen: queue.Queue[Any] = queue.Queue()
    op = _client(host, port, ["qpmesh/v1/remediation-ack/#", "qpmesh/v1/jobs/#"], seen)
    try:
        f.start()
        f.register("job1", 3, "host2", ("nic0", "nic1"))
        topic, payload, _ = _wait(seen)
        assert topic == rank_topic("qpmesh/v1", "job1", 3)
        assert json.loads(payload) == {
            "job": "job1",
            "rank": 3,
            "host": "host2",
            "nics": ["nic0", "nic1"],
            "tenant": "default",
        }
        a = ActionDoc("move_off_nic-ab", "move_off_nic", "down", "f", 1, 2, nic="nic1", job="job1")
        other = ActionDoc("move_off_nic-cd", "move_off_nic", "down", "f", 1, 2, nic="nic7", job="j")
        deadline = time.monotonic() + 10
        while inbox.empty() and time.monotonic() < deadline:  # until the subscription is live
            op.publish(action_topic("qpmesh/v1", "nic1"), b"{not json", qos=1)
            op.publish(action_topic("qpmesh/v1", "nic7"), other.encode(), qos=1)
            op.publish(action_topic("qpmesh/v1", "nic1"), a.encode(), qos=1)
            time.sleep(0.3)
        assert _wait(inbox) == a  # the malformed one was dropped, nic7 is not followed
        while not inbox.empty():
            assert inbox.get() == a
        f.ack(AckDoc(a.id, "job1/rank3", "done", 5, "moved to nic0"))
        topic, payload, _ = _wait(seen)
        assert topic == "qpmesh/v1/remediation-ack/move_off_nic-ab"
        assert AckDoc.decode(payload).outcome == "done"
    finally:
        f.stop()
        op.loop_stop()
        op.disconnect()
