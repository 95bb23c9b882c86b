"""NIC clocks as they are: steps and servo steering of the NIC clocks (pure, seeded).

Two effects on top of the free-running clock (`testbed.sim.clock_model` and the engine's
offset, drift and wander), each an offset (ns) added to a NIC's clock at true time ``t``:

* **steps**: the clock jumps by a constant at an instant and stays there. A host reboot
  restarts the NIC clock (PHC) from the system time; ptp4l steps the clock on start and when
  its offset exceeds ``step_threshold``, phc2sys likewise with ``-S``. Random steps are a
  Poisson process per NIC (``clock_step_per_h``) of log-uniform size in ``clock_step_us``
  with a random sign, drawn lazily in fixed chunks of time (values do not depend on the order
  of queries); `ClockEvents.add_step` schedules one for a scenario or a test. Steps more than
  ``STEP_HISTORY_S`` behind the latest time reached are folded into a per-NIC sum, so a day's
  run holds the steps of the last minutes, not of the day (a query that far back raises
  ValueError).
* **servo steering**: a PI servo (linuxptp's ``pi.c``: ``ki_term = ki * offset * interval``,
  ``drift += ki_term``, frequency ``-(kp * offset + drift)``) adjusts the NIC's frequency every
  ``servo_interval_s`` from an offset measured with Gaussian noise ``servo_noise_ns``. The free-
  running drift is left to the engine's model (the sync fits a constant drift anyway); what
  the servo adds is its closed-loop response to the noise, a frequency that changes at every
  update (``servo_noise_ns`` 20 and linuxptp's hardware-stamp constants 0.7 / 0.3 at 1 s:
  ~15 ppb steps). Off when ``servo_interval_s`` is 0. Its grid (a frequency and a start
  offset per NIC per update) keeps the updates of the last ``SERVO_HISTORY_S`` behind the
  latest one reached, so a day's run holds a bounded grid (a query that far back raises
  ValueError); the values do not depend on the order of queries.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from testbed.sim.model import ModelKnobs

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
STEP_CHUNK_S = 64.0  # random steps are drawn per chunk of this many seconds
SERVO_CHUNK = 64  # servo updates simulated per chunk
SERVO_HISTORY_S = 600.0  # servo updates kept behind the latest one reached (as the wander's)
STEP_HISTORY_S = 600.0  # steps kept one by one behind the latest time reached; older ones summed


class ClockEvents:
    """Offset (ns) each NIC's clock gains from steps and servo steering (module docstring)."""

    def __init__(self, n_nics: int, knobs: ModelKnobs, seed: int) -> None:
        self.n, self.knobs = n_nics, knobs
        self._step_rng = np.random.default_rng([seed, 311])
        self._servo_rng = np.random.default_rng([seed, 312])
        self._chunks = 0  # random-step chunks drawn so far
        self._nic = np.zeros(0, np.int64)  # steps: NIC, true time (ns), size (ns)
        self._t_ns = np.zeros(0)
        self._size = np.zeros(0)
        self._base = np.zeros(n_nics)  # per NIC, the sum of the steps folded (older than held)
        self._folded_ns = -math.inf  # steps at or before this true time are in ``_base``
        t = knobs.servo_interval_s
        self._servo_t = t
        self._servo_base = 0  # the update of column 0 of ``_adj`` and ``_off``
        self._adj = np.zeros((n_nics, 0))  # servo: frequency (ppb) per update interval
        self._off = np.zeros((n_nics, 0))  # offset (ns) at each interval's start
        self._x = np.zeros(n_nics)  # the servo's own offset and integrator
        self._drift = np.zeros(n_nics)

    @property
    def active(self) -> bool:
        """True when any step or steering is in force."""
        k = self.knobs
        return k.clock_step_per_h > 0 or k.servo_interval_s > 0 or len(self._nic) > 0

    @property
    def servo_held(self) -> int:
        """The servo updates held (bounded by ``SERVO_HISTORY_S`` plus a chunk or two)."""
        return int(self._adj.shape[1])

    @property
    def steps_held(self) -> int:
        """The steps held one by one (those of the last ``STEP_HISTORY_S`` and later)."""
        return len(self._nic)

    def add_step(self, nic: int, at_s: float, step_ns: float) -> None:
        """Schedule a step of ``step_ns`` on NIC ``nic`` at true time ``at_s`` (s). Raises
        ValueError for a NIC index out of range, a negative time or a time already folded
        (more than ``STEP_HISTORY_S`` behind the latest time reached)."""
        if not 0 <= nic < self.n or at_s < 0 or at_s * 1e9 <= self._folded_ns:
            raise ValueError(f"bad clock step: NIC {nic}, at {at_s} s")
        self._nic = np.append(self._nic, nic)
        self._t_ns = np.append(self._t_ns, at_s * 1e9)
        self._size = np.append(self._size, float(step_ns))

    def steps(self, until_s: float) -> list[tuple[int, float, float]]:
        """The steps held up to true time ``until_s``: (NIC, time s, size ns), by time (every
        step of a run shorter than ``STEP_HISTORY_S``; in a longer one those older than that
        behind the latest time reached are summed per NIC and no longer listed)."""
        self._draw_steps(until_s * 1e9)
        sel = np.flatnonzero(self._t_ns <= until_s * 1e9)
        sel = sel[np.argsort(self._t_ns[sel], kind="stable")]
        return [(int(self._nic[i]), float(self._t_ns[i]) / 1e9, float(self._size[i])) for i in sel]

    def _draw_steps(self, t_ns: float) -> None:
        k = self.knobs
        if k.clock_step_per_h <= 0:
            return
        lo, hi = math.log(k.clock_step_us[0]), math.log(k.clock_step_us[1])
        while self._chunks * STEP_CHUNK_S * 1e9 <= t_ns:
            rng, c0 = self._step_rng, self._chunks * STEP_CHUNK_S
            count = rng.poisson(k.clock_step_per_h * STEP_CHUNK_S / 3600.0, self.n)
            nic = np.repeat(np.arange(self.n, dtype=np.int64), count)
            m = len(nic)
            at = (c0 + rng.uniform(0.0, STEP_CHUNK_S, m)) * 1e9
            size = np.exp(rng.uniform(lo, hi, m)) * 1e3 * rng.choice([-1.0, 1.0], m)
            self._nic = np.concatenate([self._nic, nic])
            self._t_ns = np.concatenate([self._t_ns, at])
            self._size = np.concatenate([self._size, size])
            self._chunks += 1

    def _fold(self, until_ns: float) -> None:
        """Sum the steps at or before true time ``until_ns`` into ``_base`` and drop them
        (nothing, and no horizon, while no step is held and none are drawn)."""
        if until_ns <= self._folded_ns or (self.knobs.clock_step_per_h <= 0 and not len(self._nic)):
            return
        old = self._t_ns <= until_ns
        if old.any():
            self._base += np.bincount(self._nic[old], self._size[old], self.n)
            keep = ~old
            self._nic, self._t_ns, self._size = self._nic[keep], self._t_ns[keep], self._size[keep]
        self._folded_ns = until_ns

    def _run_servo(self, updates: int) -> None:
        k, dt = self.knobs, self._servo_t
        while self._servo_base + self._adj.shape[1] < updates + 1:
            noise = self._servo_rng.normal(0.0, k.servo_noise_ns, (self.n, SERVO_CHUNK))
            adj = np.empty((self.n, SERVO_CHUNK))
            off = np.empty((self.n, SERVO_CHUNK))
            last = (
                self._off[:, -1] + self._adj[:, -1] * dt if self._adj.shape[1] else np.zeros(self.n)
            )
            for c in range(SERVO_CHUNK):
                meas = self._x + noise[:, c]
                self._drift += k.servo_ki * meas * dt
                adj[:, c] = -(k.servo_kp * meas + self._drift)  # ppb = ns per s
                off[:, c] = last
                last = last + adj[:, c] * dt
                self._x = self._x + adj[:, c] * dt
            held = self._adj.shape[1]
            keep = math.ceil(SERVO_HISTORY_S / dt)
            drop = min(held, max(0, updates - keep - self._servo_base))
            self._adj = np.concatenate([self._adj[:, drop:], adj], axis=1)
            self._off = np.concatenate([self._off[:, drop:], off], axis=1)
            self._servo_base += drop

    def offset_ns(self, t_ns: F64 | float, idx: I64) -> F64:
        """Return the offset (ns) of NICs ``idx`` at true times ``t_ns`` (broadcast; times
        before 0 count as 0). Raises ValueError, with servo steering on, for a time more than
        ``SERVO_HISTORY_S`` before the latest update reached."""
        t = np.maximum(np.asarray(t_ns, dtype=np.float64), 0.0)
        tb, ib = np.broadcast_arrays(t, np.asarray(idx, dtype=np.int64))
        out = np.zeros(tb.shape)
        top = float(tb.max()) if tb.size else 0.0
        self._draw_steps(top)
        self._fold(top - STEP_HISTORY_S * 1e9)
        if tb.size and float(tb.min()) <= self._folded_ns:
            raise ValueError(f"clock steps before {self._folded_ns / 1e9:g} s are no longer held")
        out += self._base[ib]
        for nic in np.unique(self._nic):  # the NICs with steps (few): their steps by time
            mine = np.flatnonzero(self._nic == nic)
            mine = mine[np.argsort(self._t_ns[mine], kind="stable")]
            rows = ib == nic
            if rows.any():
                upto = np.concatenate([[0.0], np.cumsum(self._size[mine])])
                out[rows] += upto[np.searchsorted(self._t_ns[mine], tb[rows], side="right")]
        if self._servo_t > 0:
            dt = self._servo_t
            kn = np.floor(tb / 1e9 / dt).astype(np.int64)
            self._run_servo(int(kn.max()) if kn.size else 0)
            if kn.size and int(kn.min()) < self._servo_base:
                raise ValueError(
                    f"servo steering before {self._servo_base * dt:g} s is no longer held"
                )
            col = kn - self._servo_base
            out += self._off[ib, col] + self._adj[ib, col] * (tb / 1e9 - kn * dt)
        return out
