"""``qpmesh testbed run --secure``: the broker, configs and adversary of a secure run.

`SecureRun` (thin shell) generates the run's CA, broker certificate, passwords, ACL
(`testbed.securebroker`), the per-fabric probe HMAC key file and the controller's action
signing key with the agents' verify key (`contract.keys` format),
hands the runner the extra config lines (``[mqtt]`` TLS and credentials for every prober and
the controller, ``[auth] key_file``), runs a recovery-agent follower for the victim's NICs
and, in a thread, the adversary (`testbed.adversary`): forged probes at `PROBE_ATTACK_S`, the
MQTT attacks `MQTT_ATTACK_BEFORE_END_S` before the end. `report` scores what got through.
The compromised host is the fabric's second host, the victim the first (same leaf: the forged
datagrams do not cross the links the scenario's faults hit).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiomqtt

from contract.actionsig import new_private_seed, public_from_private
from contract.keys import ED25519_PRIVATE, ED25519_PUBLIC, HMAC, format_key_file, load_key_file
from mesh.fabric import Fabric
from mqttlink.settings import MqttSecurity, client_kwargs
from recovery.follow import Follower
from testbed.adversary import Sent, mqtt_attacks, score
from testbed.netns.plan import Plan
from testbed.runreport import Monitor
from testbed.securebroker import Material, agent_user, broker_conf, make_material

TLS_PORT = 8883
PROBE_ATTACK_S = 6.0
MQTT_ATTACK_BEFORE_END_S = 10.0
FORGED_PER_NIC = 40
JOB = "secjob"


def _write(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, mode)


def _security_lines(sec: MqttSecurity) -> list[str]:
    return [
        "tls = true",
        f'ca_file = "{sec.ca_file}"',
        f'username = "{sec.username}"',
        f'password_file = "{sec.password_file}"',
    ]


class SecureRun:
    """The secure parts of one testbed run in state directory ``d``."""

    def __init__(self, d: Path, fabric: Fabric, plan: Plan, prefix: str = "qpmesh/v1") -> None:
        self.fabric, self.plan, self.prefix = fabric, plan, prefix
        hosts = [h.id for h in fabric.hosts]
        if len(hosts) < 2:
            raise ValueError("--secure needs at least two hosts (a victim and a compromised one)")
        self.victim, self.own = hosts[0], hosts[1]
        self.victim_nics = [n.id for n in fabric.nics if n.host == self.victim]
        self.agent = agent_user(JOB, 0)
        self.material: Material = make_material(
            d / "pki", [plan.broker_addr], hosts, prefix=prefix,
            agents={self.agent: (JOB, self.victim_nics)},
        )  # fmt: skip
        self.key_file = d / "probe-keys.toml"
        _write(self.key_file, format_key_file([("run", HMAC, secrets.token_bytes(32))]), 0o600)
        seed = new_private_seed()
        self.action_key = d / "action-key.toml"  # the controller signs with it
        _write(self.action_key, format_key_file([("run", ED25519_PRIVATE, seed)]), 0o600)
        self.action_verify = d / "action-verify.toml"  # the agents verify with it
        _write(self.action_verify,
               format_key_file([("run", ED25519_PUBLIC, public_from_private(seed))]), 0o644)  # fmt: skip
        self.sent = Sent()
        self.bad_auth_before: dict[str, int] = {}
        self.actions: queue.Queue[Any] = queue.Queue()
        self.follower: Follower | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def broker(self) -> tuple[str, int]:
        """Return the broker's (address, TLS port)."""
        return self.plan.broker_addr, TLS_PORT

    def broker_conf(self) -> str:
        """Return the mosquitto configuration (TLS listener, passwords, ACL)."""
        return broker_conf(self.plan.broker_addr, TLS_PORT, self.material)

    def prober_mqtt_lines(self, host: str) -> list[str]:
        """Return the ``[mqtt]`` TLS and credential lines of ``host``'s prober."""
        return _security_lines(self.material.security(host))

    def prober_extra(self) -> str:
        """Return the prober tables a secure run adds (probe key, frequent health)."""
        return f'[auth]\nkey_file = "{self.key_file}"\n\n[telemetry]\ninterval_s = 1.0\n'

    def controller_extra(self) -> str:
        """Return the controller's ``[mqtt]`` and ``[auth]`` (action signing key) tables."""
        sec = _security_lines(self.material.security("controller"))
        return (
            "\n[mqtt]\n" + "\n".join(sec) + f'\n\n[auth]\naction_key_file = "{self.action_key}"\n'
        )

    def monitor(self) -> Monitor:
        """Return the run's monitor, logged in as the read-only monitor user."""
        return Monitor(*self.broker, prefix=self.prefix, security=self.material.security("monitor"))

    def start(self, monitor: Monitor, t0: float, duration_s: float, log: Callable[[str], None],
              env: dict[str, str]) -> None:  # fmt: skip
        """Start the victim NIC's follower and the adversary thread (times from ``t0``,
        `time.monotonic`)."""
        self.follower = Follower(*self.broker, tuple(self.victim_nics), self.actions,
                                 prefix=self.prefix, client_id="secure-run-agent",
                                 security=self.material.security(self.agent),
                                 verify_keys=load_key_file(self.action_verify,
                                                           ED25519_PUBLIC))  # fmt: skip
        try:
            self.follower.start()
        except OSError as exc:
            self.sent.errors.append(f"follower: {exc}")
            self.follower = None
        self._thread = threading.Thread(
            target=self._attack, args=(monitor, t0, duration_s, log, env), daemon=True
        )
        self._thread.start()

    def _wait_until(self, t: float) -> bool:
        return not self._stop.wait(max(0.0, t - time.monotonic()))

    def _attack(self, monitor: Monitor, t0: float, duration_s: float,
                log: Callable[[str], None], env: dict[str, str]) -> None:  # fmt: skip
        try:
            if self._wait_until(t0 + PROBE_ATTACK_S):
                self.bad_auth_before = monitor.bad_auth()
                self._forge_probes(env)
                log(f"adversary: forged probes {self.sent.probes}")
            if self._wait_until(
                t0 + max(PROBE_ATTACK_S + 1, duration_s - MQTT_ATTACK_BEFORE_END_S)
            ):
                asyncio.run(self._mqtt(monitor))
                log("adversary: foreign, replayed batches and a forged action published")
        except (OSError, aiomqtt.MqttError, TimeoutError, ValueError) as exc:
            self.sent.errors.append(f"{type(exc).__name__}: {exc}")

    def _forge_probes(self, env: dict[str, str]) -> None:
        targets = [f"{n.host}:{n.id}={n.address}:4791" for n in self.fabric.nics
                   if n.host in (self.victim, self.own)]  # fmt: skip
        sender = self.victim_nics[0]  # spoofs the victim's NIC
        argv = ["ip", "netns", "exec", self.plan.node_ns[self.own], sys.executable, "-m",
                "testbed.adversary", "probes", "--sender", sender, "--count", str(FORGED_PER_NIC),
                *(x for t in targets for x in ("--to", t))]  # fmt: skip
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
        if r.returncode:
            raise OSError(f"adversary probes: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
        self.sent.probes = {str(k): int(v) for k, v in json.loads(r.stdout)["sent"].items()}

    async def _mqtt(self, monitor: Monitor) -> None:
        victim = monitor.latest_batch(self.victim)
        if victim is None:
            self.sent.not_tried["forged_batches"] = f"no batch of {self.victim} seen to copy"
            return
        own_old = monitor.old_batch(self.own)
        kw = client_kwargs(self.material.security(self.own))
        async with aiomqtt.Client(*self.broker, identifier="adversary", timeout=10, **kw) as c:
            await mqtt_attacks(c, self.prefix, own_host=self.own, victim=victim, own_old=own_old,
                               action_nic=self.victim_nics[0], now_ns=time.time_ns(),
                               sent=self.sent)  # fmt: skip

    def stop(self) -> None:
        """Stop the adversary thread and the follower."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.follower is not None:
            self.follower.stop()

    def report(self, monitor: Monitor | None, controller_log: Path) -> dict[str, Any]:
        """Return the report's ``security`` section (`testbed.adversary.score`)."""
        log: list[dict[str, Any]] = []
        try:
            for line in controller_log.read_text().splitlines():
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if isinstance(doc, dict):
                    log.append(doc)
        except OSError:
            pass
        received: list[str] = []
        while not self.actions.empty():
            received.append(str(getattr(self.actions.get_nowait(), "id", "")))
        out = score(
            self.sent,
            monitor.arrivals if monitor is not None else [],
            log,
            self.bad_auth_before,
            monitor.bad_auth() if monitor is not None else {},
            received,
            self.prefix,
        )
        out.update({"tls": True, "acl": True, "probe_hmac": True, "signed_actions": True,
                    "victim": self.victim, "compromised_host": self.own,
                    "agent_action_gate": dict(self.follower.gate.counters)
                    if self.follower is not None else {}})  # fmt: skip
        return out
