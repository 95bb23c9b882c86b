"""packaging/nats/: the three servers' files are what `natslink.serverconf.packaged` writes,
nats-server accepts them, and their partition count is the controllers' default."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from controller.fleet.plane import Plane
from natslink.serverconf import packaged
from tests.natscluster import binary

DIR = Path(__file__).resolve().parent.parent / "packaging" / "nats"


def test_packaged_files_are_current() -> None:
    files = packaged(Plane().partitions)
    for name, text in files.items():
        assert (DIR / name).read_text() == text, f"regenerate packaging/nats/{name}"
    assert f"partition({Plane().partitions},1)" in files["nats-server-1.conf"]


def test_nats_server_accepts_them() -> None:
    exe = binary()
    if exe is None:
        pytest.skip("nats-server not installed")
    for name in packaged():
        out = subprocess.run([exe, "-t", "-c", str(DIR / name)], check=False, capture_output=True,
                             text=True, timeout=30)  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
