"""The speed-ups taken for ``sim day`` change no result: the clock floors' per-slot sort
gives `np.lexsort`'s order on every kind of input (fast path and fallback)."""

from __future__ import annotations

import numpy as np
import pytest

from controller.clockfloors import _by_slot_then_value


def _cases() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(5)
    out = []
    for n in (1, 2, 7, 300, 20_000):
        slot = np.sort(rng.integers(0, max(1, n // 3), n))
        slot[: n // 10] = rng.integers(0, max(1, n // 3), n // 10)  # nearly in slot order
        out += [
            (slot, rng.uniform(1e3, 1e6, n)),  # round trips, ns
            (slot, np.round(rng.uniform(1, 20, n))),  # many ties
            (slot, rng.uniform(-5, 5, n)),  # not positive: the lexsort
            (slot, np.where(rng.random(n) < 0.2, np.nan, 3.0)),
            (slot, np.where(rng.random(n) < 0.2, np.inf, rng.uniform(1e3, 2e3, n))),
        ]
    out.append((np.array([0, 0, 1]), np.array([1e300, 1.0, 2.0])))  # a range too wide
    out.append((np.array([4, 4, 4]), np.array([1.0 + 1e-12, 1.0, 1.0 + 2e-12])))
    return out


@pytest.mark.parametrize(("slot", "r"), _cases())
def test_slot_value_order_is_lexsorts(slot: np.ndarray, r: np.ndarray) -> None:
    o = np.lexsort((r, slot))
    s, v = _by_slot_then_value(slot.astype(np.int64), r)
    assert np.array_equal(s, slot[o])
    assert np.array_equal(v, r[o], equal_nan=True)
    assert np.array_equal(np.signbit(v), np.signbit(r[o]))
