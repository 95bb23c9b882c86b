"""Link / NIC health as one state machine with hysteresis, written as a transition table.

Every detection window the brain reduces the evidence about one entity (a link, or a NIC through
its NIC-to-leaf link) to a `Signal`: CLEAN (enough probes, none blamed on it), LOSSY (loss blamed
on it), DEAD (nearly every probe across it lost), SLOW (queueing delay blamed on one of its
directed hops) or NODATA (too few probes to say). `step` looks the pair (state, signal) up in
`TABLE` and applies the action, returning the new `EntityState` and at most one `Finding`.

States and what moves them (all windows are detection windows, i.e. ticks):

- UP --DEAD--> DOWN ("down"), or FLAPPING ("flap") when this is the ``flap_threshold``-th
  down within ``flap_window_ns``;
- UP --LOSSY x raise_windows--> DEGRADED ("loss"); UP --SLOW x raise_windows--> CONTENDED
  ("contention");
- DOWN --CLEAN--> UP ("clear": the link came back), or FLAPPING ("flap") if it already went
  down ``flap_threshold`` times in the window;
- FLAPPING --DEAD--> FLAPPING (counts one more down, once per down period: dead windows in
  a row are one down; no finding: the flap raised is still open, issue 32);
  FLAPPING --CLEAN/NODATA--> UP
  ("clear") once no down was seen for ``flap_hold_ns``;
- DEGRADED / CONTENDED --CLEAN x clear_windows--> UP ("clear").

This module knows nothing of probes, MQTT or HTTP; it is tested by driving `step` directly.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace

from mesh.snapshot import Health


class Signal(enum.StrEnum):
    """What one detection window says about one entity."""

    CLEAN = "clean"
    LOSSY = "lossy"
    DEAD = "dead"
    SLOW = "slow"
    NODATA = "nodata"


class Action(enum.Enum):
    """What a (state, signal) pair does; see the module docstring."""

    STAY = "stay"  # keep the state, reset streaks
    HOLD = "hold"  # keep the state and the streaks (no evidence either way)
    GO_DOWN = "go_down"  # record a down transition: DOWN or FLAPPING
    ARM_DEGRADED = "arm_degraded"  # count a lossy window; DEGRADED after raise_windows
    ARM_CONTENDED = "arm_contended"  # count a slow window; CONTENDED after raise_windows
    ARM_UP = "arm_up"  # count a clean window; UP after clear_windows
    REVIVE = "revive"  # a down link carries traffic again: UP or FLAPPING
    HOLD_FLAP = "hold_flap"  # flapping: back to UP once quiet for flap_hold_ns


S, H, A = Signal, Health, Action
TABLE: Mapping[tuple[Health, Signal], Action] = {
    (H.UP, S.CLEAN): A.STAY,
    (H.UP, S.NODATA): A.HOLD,
    (H.UP, S.LOSSY): A.ARM_DEGRADED,
    (H.UP, S.SLOW): A.ARM_CONTENDED,
    (H.UP, S.DEAD): A.GO_DOWN,
    (H.DEGRADED, S.CLEAN): A.ARM_UP,
    (H.DEGRADED, S.NODATA): A.HOLD,
    (H.DEGRADED, S.LOSSY): A.STAY,
    (H.DEGRADED, S.SLOW): A.STAY,
    (H.DEGRADED, S.DEAD): A.GO_DOWN,
    (H.CONTENDED, S.CLEAN): A.ARM_UP,
    (H.CONTENDED, S.NODATA): A.HOLD,
    (H.CONTENDED, S.LOSSY): A.ARM_DEGRADED,
    (H.CONTENDED, S.SLOW): A.STAY,
    (H.CONTENDED, S.DEAD): A.GO_DOWN,
    (H.DOWN, S.CLEAN): A.REVIVE,
    (H.DOWN, S.NODATA): A.HOLD,
    (H.DOWN, S.LOSSY): A.STAY,
    (H.DOWN, S.SLOW): A.REVIVE,
    (H.DOWN, S.DEAD): A.STAY,
    (H.FLAPPING, S.CLEAN): A.HOLD_FLAP,
    (H.FLAPPING, S.NODATA): A.HOLD_FLAP,
    (H.FLAPPING, S.LOSSY): A.STAY,
    (H.FLAPPING, S.SLOW): A.HOLD_FLAP,
    (H.FLAPPING, S.DEAD): A.GO_DOWN,
}
del S, H, A


class Finding(enum.StrEnum):
    """What a transition reports (the brain turns it into a `EventDoc`)."""

    DOWN = "down"
    FLAP = "flap"
    LOSS = "loss"
    CONTENTION = "contention"
    CLEAR = "clear"


@dataclass(frozen=True, slots=True)
class HealthParams:
    """Hysteresis knobs: windows to raise / clear, flap counting window, threshold and hold."""

    raise_windows: int = 2
    clear_windows: int = 3
    flap_window_ns: int = 60_000_000_000
    flap_threshold: int = 2
    flap_hold_ns: int = 10_000_000_000

    def __post_init__(self) -> None:
        if min(self.raise_windows, self.clear_windows, self.flap_threshold) < 1:
            raise ValueError("raise_windows, clear_windows and flap_threshold must be >= 1")
        if self.flap_window_ns <= 0 or self.flap_hold_ns <= 0:
            raise ValueError("flap_window_ns and flap_hold_ns must be > 0")


@dataclass(frozen=True, slots=True)
class EntityState:
    """One entity's health: state, since when, hysteresis streak, recent down times (ns)."""

    state: Health = Health.UP
    since_ns: int = 0
    streak: int = 0
    streak_of: Action | None = None
    downs: tuple[int, ...] = ()
    first_down_ns: int | None = None
    is_down: bool = False  # inside a down period (dead windows since the last clean one)

    def flap_count(self, now_ns: int, window_ns: int) -> int:
        """Return how many times the entity went down in the last ``window_ns``."""
        return sum(1 for t in self.downs if t > now_ns - window_ns)


def _arm(st: EntityState, action: Action) -> EntityState:
    streak = st.streak + 1 if st.streak_of == action else 1
    return replace(st, streak=streak, streak_of=action)


def _to(st: EntityState, state: Health, now_ns: int) -> EntityState:
    return replace(st, state=state, since_ns=now_ns, streak=0, streak_of=None)


def step(
    st: EntityState, signal: Signal, now_ns: int, params: HealthParams
) -> tuple[EntityState, Finding | None]:
    """Apply one window's ``signal`` at ``now_ns``; return (new state, finding or None).

    Raises KeyError only if `TABLE` misses a pair (it covers every state but UNKNOWN, which
    behaves like UP).
    """
    cur = Health.UP if st.state == Health.UNKNOWN else st.state
    action = TABLE[(cur, signal)]
    downs = tuple(t for t in st.downs if t > now_ns - params.flap_window_ns)
    st = replace(st, downs=downs)
    if signal in (Signal.CLEAN, Signal.SLOW):
        st = replace(st, is_down=False)
    if action == Action.GO_DOWN and st.is_down:
        return st, None  # still the same down period: not another flap
    if action == Action.STAY:
        return replace(st, streak=0, streak_of=None), None
    if action == Action.HOLD:
        return st, None
    if action == Action.GO_DOWN:
        first = st.first_down_ns if downs and st.first_down_ns is not None else now_ns
        downs = (*downs, now_ns)
        st = replace(st, downs=downs, first_down_ns=first, is_down=True)
        if len(downs) >= params.flap_threshold:
            # a flapping link that goes down again is the same flap: counted, not raised again
            again = cur == Health.FLAPPING
            return _to(st, Health.FLAPPING, now_ns), None if again else Finding.FLAP
        return _to(st, Health.DOWN, now_ns), Finding.DOWN
    if action in (Action.ARM_DEGRADED, Action.ARM_CONTENDED, Action.ARM_UP):
        st = _arm(st, action)
        if action == Action.ARM_UP:
            if st.streak >= params.clear_windows:
                return _to(replace(st, first_down_ns=None), Health.UP, now_ns), Finding.CLEAR
            return st, None
        if st.streak >= params.raise_windows:
            if action == Action.ARM_DEGRADED:
                return _to(st, Health.DEGRADED, now_ns), Finding.LOSS
            return _to(st, Health.CONTENDED, now_ns), Finding.CONTENTION
        return st, None
    if action == Action.REVIVE:
        if len(downs) >= params.flap_threshold:
            return _to(st, Health.FLAPPING, now_ns), None
        return _to(st, Health.UP, now_ns), Finding.CLEAR
    # HOLD_FLAP
    last_down = max(downs) if downs else st.since_ns
    if now_ns - last_down >= params.flap_hold_ns:
        return _to(replace(st, first_down_ns=None), Health.UP, now_ns), Finding.CLEAR
    return st, None
