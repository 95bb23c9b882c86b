"""Spool: in-order delivery, drop-oldest with counters, dedupe by batch_seq, disk backing."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prober.spool import Spool, SpoolError


def drain(sp: Spool) -> list[int]:
    out = []
    while (item := sp.peek()) is not None:
        out.append(item.batch_seq)
        assert sp.ack(item.batch_seq)
    return out


def test_in_order_and_ack_only_head() -> None:
    sp = Spool(max_batches=10)
    for s in (5, 6, 7):
        sp.put(s, b"x" * s)
    assert sp.ack(6) is False  # not the head: nothing removed
    assert len(sp) == 3 and sp.nbytes == 18
    assert drain(sp) == [5, 6, 7]
    assert sp.delivered == 3 and sp.nbytes == 0


def test_count_bound_drops_oldest_and_counts() -> None:
    sp = Spool(max_batches=3)
    dropped = [sp.put(s, b"ab") for s in range(1, 6)]
    assert dropped == [0, 0, 0, 1, 1]
    assert sp.dropped_batches == 2 and sp.dropped_bytes == 4
    assert drain(sp) == [3, 4, 5]


def test_byte_bound_drops_oldest() -> None:
    sp = Spool(max_batches=100, max_bytes=10)
    sp.put(1, b"1234")
    sp.put(2, b"1234")
    assert sp.put(3, b"123456") == 1  # 4 + 4 + 6 > 10: drop batch 1
    assert drain(sp) == [2, 3]


def test_duplicate_and_stale_seq_ignored() -> None:
    sp = Spool()
    sp.put(10, b"a")
    assert sp.put(10, b"a") == 0
    assert sp.put(3, b"old") == 0
    assert sp.duplicates == 2 and len(sp) == 1
    assert sp.last_seq == 10


def test_stale_ack_after_drop_is_harmless() -> None:
    sp = Spool(max_batches=1)
    sp.put(1, b"a")
    head = sp.peek()
    assert head is not None
    sp.put(2, b"b")  # batch 1 dropped while "in flight"
    assert sp.ack(head.batch_seq) is False
    assert drain(sp) == [2]


@pytest.mark.parametrize(
    ("kw", "msg"), [({"max_batches": 0}, "positive"), ({"max_bytes": -1}, "positive")]
)
def test_bad_bounds(kw: dict[str, int], msg: str) -> None:
    with pytest.raises(SpoolError, match=msg):
        Spool(**kw)


def test_bad_items() -> None:
    sp = Spool(max_bytes=4)
    with pytest.raises(SpoolError, match="exceeds"):
        sp.put(1, b"12345")
    with pytest.raises(SpoolError, match="uint64"):
        sp.put(-1, b"1")
    with pytest.raises(SpoolError, match="uint64"):
        sp.put(1 << 64, b"1")
    assert len(sp) == 0


def test_disk_backing_survives_restart(tmp_path: Path) -> None:
    d = tmp_path / "spool"
    sp = Spool(max_batches=3, directory=d)
    for s in range(1, 5):
        sp.put(s, f"b{s}".encode())
    assert sp.ack(2)
    (d / "junk.txt").write_text("ignored")
    again = Spool(max_batches=3, directory=d)
    assert [again.peek() and again.peek().payload] == [b"b3"]  # type: ignore[union-attr]
    assert drain(again) == [3, 4]
    assert sorted(p.name for p in d.iterdir()) == ["junk.txt"]
    assert again.last_seq == 4


def test_disk_reload_applies_smaller_bound(tmp_path: Path) -> None:
    sp = Spool(max_batches=10, directory=tmp_path)
    for s in range(1, 6):
        sp.put(s, b"x")
    small = Spool(max_batches=2, directory=tmp_path)
    assert drain(small) == [4, 5]
    assert small.dropped_batches == 3
    assert not list(tmp_path.glob("*.qpb"))


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(st.one_of(st.integers(1, 40), st.just(-1)), max_size=80),
    bound=st.integers(1, 8),
)
def test_property_order_bound_and_accounting(ops: list[int], bound: int) -> None:
    """Whatever is put and acked: delivered seqs increase, bounds hold, every batch is
    either delivered, dropped, still spooled, or counted as duplicate."""
    sp = Spool(max_batches=bound, max_bytes=1 << 20)
    delivered: list[int] = []
    puts = 0
    seq = 0
    for op in ops:
        if op == -1:
            head = sp.peek()
            if head is not None:
                sp.ack(head.batch_seq)
                delivered.append(head.batch_seq)
        else:
            seq += op % 3  # sometimes repeats a seq (duplicate)
            puts += 1
            sp.put(seq, b"p" * op)
        assert len(sp) <= bound
    assert delivered == sorted(set(delivered))
    assert puts == sp.delivered + sp.dropped_batches + len(sp) + sp.duplicates
