"""The allocator settings every qpmesh process starts with (`qpmesh.heap`)."""

from __future__ import annotations

import pytest

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
