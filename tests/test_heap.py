"""The allocator settings every qpmesh process starts with (`qpmesh.heap`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qpmesh import cli, heap
from qpmesh.heap import keep_freed_blocks, operator_chose


@pytest.mark.parametrize(
    "env",
    [
        {"QPMESH_HEAP": "default"},
        {"MALLOC_TRIM_THRESHOLD_": "1000"},
        {"MALLOC_MMAP_THRESHOLD_": "65536"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000"},
    ],
)
def test_an_operators_own_allocator_settings_are_left_alone(env: dict[str, str]) -> None:
    assert operator_chose(env)
    assert keep_freed_blocks(env) is False


def test_unrelated_settings_do_not_count_as_a_choice() -> None:
    assert not operator_chose({"GLIBC_TUNABLES": "glibc.pthread.rseq=0", "QPMESH_HEAP": "x"})


def test_glibc_takes_the_thresholds() -> None:
    """On this machine's glibc both mallopt calls succeed."""
    assert keep_freed_blocks({}) is True


def test_every_command_sets_them_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`qpmesh.cli.main` asks for the thresholds before it runs a command (here one that
    fails on a missing file: exit 1, one line), once."""
    calls: list[int] = []
    monkeypatch.setattr(heap, "keep_freed_blocks", lambda: calls.append(1) or True)
    assert cli.main(["keys", "show", str(tmp_path / "missing.key")]) in (1, 2)
    assert calls == [1]
