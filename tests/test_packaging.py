"""Installing qpmesh on real hosts: the systemd units pass ``systemd-analyze verify`` and ask
for capabilities, not root; the Kubernetes manifests pass the Kubernetes schemas
(``kubernetes-validate``, strict); the wheel ``python -m build`` makes installs in a fresh venv
with the compiled hot path, and its ``qpmesh doctor --json`` runs (slow: it compiles)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNITS = ROOT / "packaging" / "systemd"
MANIFESTS = ROOT / "packaging" / "kubernetes"
INSTALLED = "/opt/qpmesh/bin/qpmesh"  # where docs/deploy.md installs the venv


def _unit(name: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (UNITS / name).read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def _verify(unit: Path, tmp: Path, qpmesh: str) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` on a copy of ``unit`` whose ExecStart names ``qpmesh`` (the
    verifier checks that the program exists; the installed path does not on a test machine)."""
    copy = tmp / unit.name
    copy.write_text(unit.read_text().replace(INSTALLED, qpmesh))
    return subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def _qpmesh() -> str:
    here = Path(sys.executable).parent / "qpmesh"
    found = str(here) if here.exists() else shutil.which("qpmesh")
    if not found:
        pytest.skip("no qpmesh executable next to this Python")
    return found


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_units_verify(tmp_path: Path) -> None:
    for unit in sorted(UNITS.glob("*.service")):
        r = _verify(unit, tmp_path, _qpmesh())
        assert r.returncode == 0 and r.stdout + r.stderr == "", unit.name + ": " + r.stderr
    # the check bites: a typo and a missing program are both reported
    bad = tmp_path / "bad"
    bad.mkdir()
    broken = bad / "qpmesh-prober.service"
    broken.write_text(
        (UNITS / "qpmesh-prober.service").read_text().replace("NoNewPrivileges", "NoNewPrivilege")
    )
    r = _verify(broken, bad, _qpmesh())
    assert "Unknown key" in r.stderr
    r = _verify(UNITS / "qpmesh-prober.service", bad, "/nonexistent/qpmesh")
    assert r.returncode != 0 and "is not executable" in r.stderr


def test_units_ask_for_capabilities_not_root() -> None:
    prober, controller = _unit("qpmesh-prober.service"), _unit("qpmesh-controller.service")
    need = {"CAP_NET_RAW", "CAP_NET_ADMIN", "CAP_IPC_LOCK"}
    assert set(prober["AmbientCapabilities"][0].split()) == need
    assert set(prober["CapabilityBoundingSet"][0].split()) == need
    assert prober["DynamicUser"] == ["yes"] and "User" not in prober
    assert prober["LimitMEMLOCK"] == ["infinity"]
    assert controller["CapabilityBoundingSet"] == [""] and controller["DynamicUser"] == ["yes"]
    for unit in (prober, controller):
        assert unit["ExecStart"][0].startswith(INSTALLED + " ")


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    yaml = pytest.importorskip("yaml")
    out = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        out += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


@pytest.mark.parametrize("version", ["1.28.0", "1.37.0"])
def test_kubernetes_manifests_pass_the_schemas(version: str) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    docs = _manifests()
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for _, d in docs)
    assert kinds == [
        "ConfigMap/qpmesh-broker", "ConfigMap/qpmesh-controller", "ConfigMap/qpmesh-prober",
        "DaemonSet/qpmesh-prober", "Deployment/qpmesh-broker", "Deployment/qpmesh-controller",
        "Namespace/qpmesh", "Service/qpmesh-broker", "Service/qpmesh-controller",
        "Service/qpmesh-victoria-metrics", "StatefulSet/qpmesh-victoria-metrics",
    ]  # fmt: skip
    for _, doc in docs:
        kv.validate(doc, version, strict=True)  # raises ValidationError naming the field
    # the check bites: a misspelt field and a wrong type are refused
    ds = next(d for _, d in docs if d["kind"] == "DaemonSet")
    with pytest.raises(kv.ValidationError):
        kv.validate({**ds, "spec": {**ds["spec"], "updateStrategie": {}}}, version, strict=True)
    pod = ds["spec"]["template"]["spec"]
    with pytest.raises(kv.ValidationError):
        bad = {**pod, "hostNetwork": "yes"}
        kv.validate({**ds, "spec": {**ds["spec"], "template": {"spec": bad}}}, version, strict=True)


def test_the_prober_daemonset_probes_from_the_host_with_three_capabilities() -> None:
    ds = next(d for _, d in _manifests() if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    (c,) = pod["containers"]
    caps = c["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"], "add": ["NET_RAW", "NET_ADMIN", "IPC_LOCK"]}
    assert c["securityContext"].get("privileged") is not True
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["lldpd"] == "/run/lldpd.socket"
    ctl = next(
        d
        for _, d in _manifests()
        if d["kind"] == "Deployment" and "controller" in d["metadata"]["name"]
    )
    assert ctl["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def _copy_source(dst: Path) -> None:
    """The tracked sources, without any build output (so the wheel must compile the C)."""
    ignore = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__",
                                    "*.so", ".mypy_cache", ".ruff_cache", ".pytest_cache",
                                    ".hypothesis", "reports")  # fmt: skip
    shutil.copytree(ROOT, dst, ignore=ignore)


@pytest.mark.slow
def test_the_wheel_installs_in_a_fresh_venv_with_the_compiled_hot_path(tmp_path: Path) -> None:
    pytest.importorskip("build")
    src, dist, venv = tmp_path / "src", tmp_path / "dist", tmp_path / "venv"
    _copy_source(src)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                    str(dist), str(src)], check=True, capture_output=True, env=env,
                   timeout=600)  # fmt: skip
    (wheel,) = dist.glob("qpmesh-*.whl")
    assert "-cp311-" in wheel.name and "linux" in wheel.name  # a platform wheel: it has the C
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert any(n.startswith("prober/_fastpath") and n.endswith(".so") for n in names)
    assert "testbed/scenarios/netns_small.toml" in names
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=300)
    # the dependencies come from this test's environment (no package index in tests); the
    # wheel itself is installed for real, first on the new venv's path
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "_qpmesh_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, env=env, timeout=300)  # fmt: skip
    run = {"env": env, "cwd": tmp_path, "capture_output": True, "text": True, "timeout": 120}
    r = subprocess.run([str(venv / "bin" / "qpmesh"), "--help"], check=True, **run)  # type: ignore[call-overload]
    assert "doctor" in r.stdout and "prober" in r.stdout
    r = subprocess.run([str(venv / "bin" / "python"), "-c",
                        "import prober, prober._fastpath as f; print(prober.__file__); print(f.__file__)"],
                       check=True, **run)  # type: ignore[call-overload]  # fmt: skip
    pkg, ext = r.stdout.split()
    assert pkg.startswith(str(site)) and ext.startswith(str(site / "prober" / "_fastpath"))
    r = subprocess.run([str(venv / "bin" / "qpmesh"), "doctor", "--json"], check=False, **run)  # type: ignore[call-overload]
    assert r.returncode in (0, 1), r.stderr  # 1: no RDMA NIC on this host, which it says
    assert json.loads(r.stdout)["checks"][0]["name"] == "nics"
    # the units name the installed program: they verify against this venv's qpmesh too
    if shutil.which("systemd-analyze"):
        for unit in sorted(UNITS.glob("*.service")):
            v = _verify(unit, tmp_path, str(venv / "bin" / "qpmesh"))
            assert v.returncode == 0 and v.stderr == "", v.stderr
