"""Key material never appears in outputs: a configured controller (signing key, API,
remediation on), a prober (probe key) and every error a bad key file gives, searched for the
keys in hex and base64."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from contract.keys import load_key_file
from tests.servers import free_port

pytestmark = pytest.mark.broker

TOKEN = "op-secret-token-1"


def _qpmesh(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qpmesh.cli", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)  # fmt: skip


def _forms(material: bytes) -> list[str]:
    """Every way the key could leak: hex (both cases), base64, and long pieces of them."""
    h = material.hex()
    b64 = base64.b64encode(material).decode()
    return [h, h.upper(), b64, h[:16], h[-16:], b64[:16], repr(material)[2:20]]


def test_no_key_material_in_logs_api_dry_run_or_errors(
    mosquitto: tuple[str, int], tmp_path: Path
) -> None:
    outputs: list[str] = []
    probe_keys, ctl_keys, pub = tmp_path / "probe.keys", tmp_path / "ctl.keys", tmp_path / "a.pub"
    for args in (("probe", "--out", str(probe_keys)),
                 ("action", "--out", str(ctl_keys), "--public", str(pub))):  # fmt: skip
        r = _qpmesh("keys", "gen", *args)
        assert r.returncode == 0, r.stderr
        outputs += [r.stdout, r.stderr]
    secrets = [k.material for k in load_key_file(probe_keys).keys]
    secrets += [k.material for k in load_key_file(ctl_keys).keys]
    r = _qpmesh("keys", "show", str(ctl_keys), "--json")
    outputs += [r.stdout, r.stderr]

    host, port = mosquitto
    api_port = free_port()
    (tmp_path / "ctl.toml").write_text(
        "[fabric]\nleaves = 1\nhosts_per_leaf = 2\nspines = 1\n"
        f'[api]\nlisten = "127.0.0.1:{api_port}"\noperator_token = "{TOKEN}"\n'
        "[remediation]\ncontrol = true\n"
        f'[auth]\naction_key_file = "{ctl_keys}"\n'
    )
    (tmp_path / "p.toml").write_text(
        '[prober]\nhost = "host0"\ntimeout_ms = 200\n'
        f'[mqtt]\nhost = "{host}"\nport = {port}\ntimeout_s = 3.0\n'
        '[telemetry]\ngpu = false\n[paths]\nenabled = false\n'
        f'[auth]\nkey_file = "{probe_keys}"\n'
        '[[nics]]\nid = "nic0"\naddress = "127.0.0.1"\n'
        '[[peers]]\nid = "nic1"\naddress = "127.0.0.2"\n'
    )  # fmt: skip
    log = tmp_path / "controller.jsonl"
    out_f, err_f = (tmp_path / "ctl.out").open("w"), (tmp_path / "ctl.err").open("w")
    ctl = subprocess.Popen(
        [sys.executable, "-m", "qpmesh.cli", "controller", "--broker", f"mqtt://{host}:{port}",
         "--config", str(tmp_path / "ctl.toml"), "--log", str(log)],
        stdout=out_f, stderr=err_f,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{api_port}/api/v1/"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if log.exists() and "connected" in log.read_text():
                break
            time.sleep(0.1)
        for args in (("--dry-run",), ("--dry-run", "--json"), ("--once", "--json")):
            r = _qpmesh("prober", "--config", str(tmp_path / "p.toml"), *args)
            assert r.returncode == 0, r.stderr
            outputs += [r.stdout, r.stderr]
        assert json.loads(outputs[-2])["host"] == "host0"
        for path in ("snapshot", "links", "events", "clocks", "jobs", "actions", "control",
                     "health", "version", "delays"):  # fmt: skip
            req = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {TOKEN}"})
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    outputs.append(resp.read().decode())
            except urllib.error.HTTPError as exc:  # a 4xx body is an output too
                outputs.append(exc.read().decode())
    finally:
        ctl.terminate()
        ctl.wait(timeout=20)
        out_f.close()
        err_f.close()
    outputs += [log.read_text(), (tmp_path / "ctl.out").read_text(),
                (tmp_path / "ctl.err").read_text()]  # fmt: skip
    assert "remediation actions signed" in outputs[-3]  # the run really had the signing key
    assert any('"snapshot"' in o or '"nics"' in o for o in outputs)

    # every error a bad key file gives
    probe_keys.chmod(0o644)
    ctl_keys.chmod(0o640)
    for args in (
        ("prober", "--config", str(tmp_path / "p.toml"), "--dry-run"),
        ("controller", "--broker", f"mqtt://{host}:{port}", "--config", str(tmp_path / "ctl.toml")),
        ("keys", "show", str(probe_keys)),
    ):
        r = _qpmesh(*args)
        assert r.returncode == 2 and "key file has mode" in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1
        outputs += [r.stdout, r.stderr]
    probe_keys.chmod(0o600)
    text = probe_keys.read_text()
    probe_keys.write_text(text.replace('hex = "', 'hex = "zz'))
    r = _qpmesh("prober", "--config", str(tmp_path / "p.toml"), "--dry-run")
    assert r.returncode == 2 and "is not valid hex" in r.stderr
    outputs += [r.stdout, r.stderr]
    probe_keys.write_text(text.replace('hex = "', 'hex = "0'))  # odd length
    r = _qpmesh("prober", "--config", str(tmp_path / "p.toml"), "--once")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    outputs += [r.stdout, r.stderr]

    blob = "\n".join(outputs)
    assert len(blob) > 2000
    for material in secrets:
        for form in _forms(material):
            assert form not in blob, f"key material leaked ({form[:4]}...)"
    assert os.stat(ctl_keys).st_size > 0
