"""schemathesis against the live API from docs/openapi.yaml, every check on, for an operator
and a tenant token: no 5xx, every response matches its schema, schema-valid requests are
accepted and schema-violating ones refused (so the description states every rule the
server enforces), authentication is enforced, unsupported methods are 405 with ``Allow``.

The HTTP routes run through schemathesis's own runner (examples, coverage, fuzzing and
stateful phases; ``--checks all``; `tests/schemathesis.toml` holds the expected statuses).
The websocket route runs in-process, each request on a fresh connection: an HTTP client
that got ``101 Switching Protocols`` must not send its next request on that connection.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from controller.api.app import ApiOptions, api_stats, make_app
from controller.api.auth import Principal, TokenTable
from controller.api.hub import ApiHub
from controller.api.server import ApiThread
from controller.jobs import Job, JobRegistry
from controller.remediation.runtime import RemediationRuntime
from controller.tenancy import Grants
from testbed.sim.demo_runner import DemoRunner, demo_scenario

ROOT = Path(__file__).parents[1]
OPENAPI = ROOT / "docs" / "openapi.yaml"
CONFIG = Path(__file__).with_name("schemathesis.toml")
TOKEN = "schemathesis-operator"
TENANT = "schemathesis-tenant"


@pytest.fixture(scope="module")
def live_api() -> Iterator[tuple[str, ApiThread]]:
    runner = DemoRunner(demo_scenario(None, nics=16, seed=2))
    hub = ApiHub(runner.controller.snapshot())
    for _ in range(20):
        hub.publish(runner.controller.snapshot(), tuple(runner.step()))
    fab = runner.fabric
    grants = Grants.build({"t": ["host0"], "u": ["host1"]}, fab)
    tokens = TokenTable({TOKEN: Principal("operator", "st"), TENANT: Principal("tenant", "t")})
    jobs = JobRegistry((Job("t:j", "t", (("nic0",), ("nic0",))),), grants=grants)
    rem = RemediationRuntime(jobs=jobs)
    rem.log.add({"t_ns": 5, "disposition": "would_have", "id": "move_off_nic-1", "kind":
                 "move_off_nic", "nic": "nic0", "link": "", "job": "t:j", "reason": "down",
                 "finding": "nic_down@nic0@1", "issued_at_ns": 5, "expires_at_ns": 9}, "t")  # fmt: skip
    app = make_app(hub, tokens, jobs=jobs, control=rem.control, actions=rem.log, ask=rem.ask,
                   options=ApiOptions(rate_per_s=1e6, burst=1e6), grants=grants)  # fmt: skip
    srv = ApiThread(app, "127.0.0.1", 0)
    port = srv.start()
    try:
        yield f"http://127.0.0.1:{port}", srv
    finally:
        srv.stop()


@pytest.mark.parametrize("token", [TOKEN, TENANT])
def test_every_http_route_passes_every_check(
    live_api: tuple[str, ApiThread], token: str, tmp_path: Path
) -> None:
    base_url, srv = live_api
    _schemathesis(base_url, token, tmp_path)
    assert not api_stats(srv.app).server_errors


def _schemathesis(base_url: str, token: str, cwd: Path, *extra: str) -> None:
    """Run schemathesis with every check on the HTTP routes of ``base_url``; assert it
    passed."""
    st = Path(sys.executable).with_name("st")
    cmd = [str(st), "--config-file", str(CONFIG), "run", str(OPENAPI), "--url", base_url,
           "-H", f"Authorization: Bearer {token}", "--checks", "all", "--max-examples", "10",
           "--seed", "33", "--generation-deterministic", "-w", "1", "--no-color",
           "--exclude-path", "/api/v1/ws", *extra]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False,
                         cwd=cwd)  # its .schemathesis/ cache lands there  # fmt: skip
    tail = "\n".join(out.stdout.splitlines()[-60:])
    assert out.returncode == 0, tail
    assert " passed" in tail and "Failures:" not in tail and "Errors:" not in tail, tail


QP = [sys.executable, "-m", "qpmesh.cli"]


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGTERM ``proc``; return its stdout and stderr (killed if it does not end)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.slow
def test_every_check_passes_against_qpmesh_demo_serve(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [*QP, "demo", "--headless", "--json", "--duration", "100000", "--serve", "127.0.0.1:0",
         "--token", TOKEN],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # "qpmesh demo: API on URL (operator token: T)"
        m = re.search(r"API on (http://\S+)/api/v1/ ", line)
        assert m, line
        # the demo serves its operator token at the default 50 requests/s: stay under it
        _schemathesis(m.group(1), TOKEN, tmp_path, "--rate-limit", "40/s")
    finally:
        out, err = _stop(proc)
    assert proc.returncode == 130 and json.loads(out)["interrupted"] is True, err
    assert "Traceback" not in err, err  # no server error, nothing in plain text


@pytest.mark.broker
@pytest.mark.slow
def test_every_check_passes_against_a_controller_served_over_mutual_tls(
    mosquitto: tuple[str, int], tmp_path: Path
) -> None:
    """``qpmesh controller`` with a fabric, two tenants granted NICs and the API over TLS with
    client certificates (its own API process), as an operator and as a tenant."""
    from tests.pki import make_pki

    pki = make_pki(tmp_path)
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    (tmp_path / "tokens.txt").write_text(f"operator st {TOKEN}\ntenant t {TENANT}\n")
    conf = tmp_path / "c.toml"
    conf.write_text(
        "[fabric]\nleaves = 2\nhosts_per_leaf = 4\n[controller]\ntick_s = 0.2\n"
        f'[api]\nlisten = "127.0.0.1:{port}"\ntoken_file = "tokens.txt"\n'
        "rate_per_s = 1000000\nburst = 1000000\n"
        'tls_cert = "server.crt"\ntls_key = "server.key"\ntls_client_ca = "ca.crt"\n'
        '[api.tenants]\nt = ["host0", "host1"]\nu = ["host4"]\n'
    )
    log = tmp_path / "controller.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [*QP, "controller", "--broker", f"mqtt://{mosquitto[0]}:{mosquitto[1]}", "--config",
         str(conf), "--log", str(log), "--prefix", f"qpmesh/st{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while '"api serving"' not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the API did not start"
            time.sleep(0.1)
        (serving,) = [json.loads(x) for x in log.read_text().splitlines() if "api serving" in x]
        assert serving["url"] == f"https://127.0.0.1:{port}/api/v1/"
        tls = ("--tls-verify", str(pki["ca"][0]), "--request-cert", str(pki["client"][0]),
               "--request-cert-key", str(pki["client"][1]))  # fmt: skip
        for token in (TOKEN, TENANT):
            _schemathesis(f"https://127.0.0.1:{port}", token, tmp_path, *tls)
    finally:
        _, err = _stop(proc)
    lines = [json.loads(x) for x in log.read_text().splitlines()]  # JSON lines only
    assert not [x for x in lines if "Traceback" in json.dumps(x)], lines
    assert "Traceback" not in err, err


WS = schemathesis.openapi.from_path(OPENAPI, config=schemathesis.Config.from_path(CONFIG))


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("token", [TOKEN, TENANT])
def test_the_websocket_route_passes_every_check(
    live_api: tuple[str, ApiThread], mode: GenerationMode, token: str
) -> None:
    base_url, srv = live_api
    op = WS["/api/v1/ws"]["GET"]

    @settings(max_examples=10, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        with requests.Session() as session:  # a 101 leaves this connection to the websocket
            del session.headers["Connection"]  # requests' keep-alive would replace Upgrade
            headers = {"Authorization": f"Bearer {token}"}
            resp = case.call(base_url=base_url, session=session, headers=headers, timeout=30)
            case.validate_response(resp, headers=headers, transport_kwargs={"session": session})

    run()
    assert not api_stats(srv.app).server_errors
