"""The capture of a `qpmesh testbed run` and its offline replay (`testbed.replay`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed.replay import CAPTURE, CaptureError, read_capture, replay, write_capture

ROOT = Path(__file__).resolve().parents[1]


def test_capture_round_trips_bytes_topics_and_times(tmp_path: Path) -> None:
    raw = [(5, "qpmesh/v1/probes/host0", b"\x00\xffabc"), (7, "qpmesh/v1/presence/h", b"")]
    assert write_capture(tmp_path / CAPTURE, raw) == 2
    assert list(read_capture(tmp_path / CAPTURE)) == raw


def test_a_bad_capture_line_names_its_line(tmp_path: Path) -> None:
    write_capture(tmp_path / CAPTURE, [(1, "t", b"x")])
    with (tmp_path / CAPTURE).open("a") as f:
        f.write('{"t_ns": 2, "topic": "t"}\n')
    with pytest.raises(CaptureError, match=r"mqtt\.jsonl:2: not a capture record"):
        list(read_capture(tmp_path / CAPTURE))


def test_replay_of_an_empty_capture_gives_no_events(tmp_path: Path) -> None:
    (tmp_path / "controller.toml").write_text("[fabric]\nleaves = 2\nhosts_per_leaf = 2\n")
    write_capture(tmp_path / CAPTURE, [])
    r = replay(tmp_path)
    assert r.events == () and r.outcomes == {} and r.solves == 0


def test_cli_replay_of_a_directory_without_a_capture_is_one_line_exit_2(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "qpmesh.cli", "testbed", "replay", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "mqtt.jsonl: not found" in out.stderr
