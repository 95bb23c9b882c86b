"""Unsupervised anomalies of hosts, NICs and GPUs: each entity against its own normal and
against its peers, with robust statistics (pure: windows in, anomalies out).

Per window and entity kind, every scored signal (catalogue ``bad`` not ``none``) of every
entity is put on its comparison scale: y = log2(1 + value / scale) for signals that span
decades (``log``), value / scale for the others. One unit of y is the catalogue's
resolution, so 1 is also the smallest spread a comparison divides by.

1. **Own normal.** Per entity and signal an exponentially weighted, winsorized mean of y
   (the normal ``b``) and the weighted mean deviations above and below it (``s+``, ``s-``):
   each window moves ``b`` by ``alpha`` (from ``half_life`` windows) of the difference,
   clipped to ``clip`` spreads, so a burst cannot drag the normal; windows in which the
   entity scores as anomalous, and signals its whole group moved (step 4), do not update
   it, so a lasting fault is not learned as normal. The default half-life, 360 windows, is
   an hour of 10 s windows. ``d = y - b`` is the change from the entity's own normal;
   ``z_self = d / max(2.5 s+, 1)`` for a rise and ``d / max(2.5 s-, 1)`` for a fall (2.5 s+
   ~ one standard deviation for symmetric noise): a signal that often *drops* (pauses in a
   job's evaluation phase) keeps a tight bound on how far it *rises*. The normal counts
   after ``warmup`` windows; it restarts when the entity changes peer group (a new job is a
   new normal).
2. **Peers.** Entities of one peer group (the hosts of one job, else of one leaf: they do the
   same work) should change together: ``z_peer = (d - median(d)) / max(1.4826 MAD(d), 1)``
   over the group's entities with a normal (at least ``min_peers``); when the group spans
   several hosts, an entity's peers are the *other* hosts' entities (one host's NICs share
   its configuration and its faults). A job's phase change (evaluation, checkpoint) moves
   every member's ``d`` and cancels here.
3. **Score.** Only the direction that means trouble counts (``bad``: up, down, both). A
   signal's score is ``min(z_self, z_peer)``: it changed from its own normal *and* unlike its
   peers; with fewer than ``min_peers`` peers, ``z_self`` alone, except in a window where
   the entity's group moved as a whole in another kind (`FleetDetector`: the job's GPUs
   went idle for a checkpoint), which is the job's phase. An entity without a normal yet is
   not scored; ``config`` signals (which should equal the peers') are always scored on the
   peers' robust z of y itself. The entity's score is its largest signal score; the signals over
   half the threshold, largest first, are its top contributors.
4. **Whole groups.** What peers cancel is reported apart: per group, the signals whose
   median own-normal score over the members is at least half the threshold (``moves``: a
   leaf marking every packet of a job that sits under it; half, because every member
   agrees). The root-cause walk reads them; they
   raise no anomaly event, since no member differs from the others.
5. **Episodes.** An entity scoring at least ``threshold`` in ``persist`` windows in a row
   starts an anomaly episode (one `Anomaly`, and one ``anomaly`` `EventDoc`); ``clear``
   windows in a row under the threshold end it.

What this cannot see: a fault every peer shares (a job-wide problem, a leaf-wide fault when
the whole job sits under that leaf) cancels in step 2 and is seen only when the group has
fewer than ``min_peers`` members; a fault present before an entity's normal was learned is
seen against peers only; a change slower than the normal's half-life is learned.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from contract.signals import BY_NAME, Entity, Signal, signals_of
from controller.anomaly.frame import SignalFrame

Array = npt.NDArray[np.float64]
_DIRS = {"up": 1, "down": -1, "both": 2, "none": 0}


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """The detector's parameters (see the module docstring); raises ValueError if invalid."""

    threshold: float = 6.0
    persist: int = 3
    clear: int = 3
    warmup: int = 30
    half_life: float = 360.0
    clip: float = 4.0
    min_peers: int = 4
    top: int = 12
    contrib: float = 2.0

    def __post_init__(self) -> None:
        if not (self.threshold > 0 and self.half_life > 0 and self.clip > 0):
            raise ValueError("threshold, half_life and clip must be > 0")
        if min(self.persist, self.clear, self.warmup, self.min_peers, self.top) < 1:
            raise ValueError("persist, clear, warmup, min_peers and top must be >= 1")

    @property
    def alpha(self) -> float:
        """Return the weight of a new window in the own normal."""
        return float(1.0 - 0.5 ** (1.0 / self.half_life))


@dataclass(frozen=True, slots=True)
class Contributor:
    """One signal behind an anomaly: its score, its value now, the entity's own normal and
    its peers' median (published units; None when not known)."""

    signal: str
    score: float
    value: float
    normal: float | None
    peers: float | None

    def text(self) -> str:
        """Return e.g. ``pfc_rx_p3 41 k/s (normal 120 /s, peers 150 /s)``."""
        unit = BY_NAME[self.signal].unit
        parts = [p for p in (
            None if self.normal is None else f"normal {fmt_value(self.normal, unit)}",
            None if self.peers is None else f"peers {fmt_value(self.peers, unit)}",
        ) if p]  # fmt: skip
        extra = f" ({', '.join(parts)})" if parts else ""
        return f"{self.signal} {fmt_value(self.value, unit)}{extra}"


@dataclass(frozen=True, slots=True)
class Anomaly:
    """An entity in an anomaly episode: its kind, id, score now, when the episode started,
    and its top contributing signals."""

    t_ns: int
    kind: Entity
    entity: str
    score: float
    since_ns: int
    top: tuple[Contributor, ...] = field(default_factory=tuple)

    @property
    def signals(self) -> tuple[str, ...]:
        """Return the names of the top contributing signals."""
        return tuple(c.signal for c in self.top)

    def detail(self) -> str:
        """Return the one-line detail of this anomaly's event."""
        what = "; ".join(c.text() for c in self.top[:4]) or "no single signal"
        return f"{self.kind} {self.entity} differs from its normal and its peers: {what}"

    def event(self) -> EventDoc:
        """Return the ``anomaly`` event of this anomaly."""
        return EventDoc(t_ns=self.t_ns, kind="anomaly", target=self.entity, detail=self.detail())


def fmt_value(v: float, unit: str) -> str:
    """Return ``v`` with SI prefixes: ``41 k/s`` for 41,000 frames/s, ``1.2 GB/s``."""
    per = "/s" if unit.endswith("/s") else ""
    base = unit[: -len("/s")] if per else unit
    short = {"B": "B", "bits": "b"}.get(base, "")
    a = abs(v)
    for div, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div and base not in ("%", "MHz", "W", "degC", "bytes"):
            return f"{v / div:.3g} {prefix}{short}{per}"
    if base in ("%", "MHz", "W", "degC", "bytes", "0/1"):
        return f"{v:.4g} {unit}"
    return f"{v:.3g} {short}{per}".rstrip()


@dataclass(frozen=True, slots=True)
class WindowResult:
    """A window's outcome for one kind: the episodes that started, every entity now in an
    episode (with this window's contributors), the entities whose episode ended, and per
    peer group how far its members moved together (the largest median change from their
    normals, in resolution units: a job's phase shows here) and the signals a whole group
    moved together in the direction that means trouble (`moves`: what peers cancel)."""

    new: tuple[Anomaly, ...]
    active: tuple[Anomaly, ...]
    ended: tuple[str, ...]
    shifts: Mapping[str, float] = field(default_factory=dict)
    moves: Mapping[str, tuple[Contributor, ...]] = field(default_factory=dict)


def nan_median(xs: Array) -> tuple[Array, npt.NDArray[np.int64]]:
    """Return each column's median ignoring NaN (NaN for an empty column) and its count of
    values: one sort, no masked arrays (``np.nanmedian`` is ~50x slower on small blocks)."""
    srt = np.sort(xs, axis=0)  # NaN sorts last
    cnt = np.sum(~np.isnan(xs), axis=0)
    lo = np.maximum((cnt - 1) // 2, 0)[None, :]
    hi = np.maximum(cnt // 2 - (cnt == 0), 0)[None, :]
    if not len(xs):
        return np.full(xs.shape[1], np.nan), cnt
    med = (np.take_along_axis(srt, lo, 0)[0] + np.take_along_axis(srt, hi, 0)[0]) / 2
    return np.where(cnt > 0, med, np.nan), cnt


def _peer_z(
    x: Array,
    labels: npt.NDArray[np.int64],
    min_peers: int,
    owners: npt.NDArray[np.int64] | None = None,
) -> tuple[Array, Array]:
    """Return (robust z of each row against its group, the group median per row); NaN
    where the peers have fewer than ``min_peers`` values of that column. With ``owners``
    (each row's host), a row's peers in a group of several hosts are the rows of the
    *other* hosts: the NICs of one host share its configuration and its faults, they are
    not one another's peers (a host-wide fault on half a job's hosts would otherwise sit on
    the median). A group that is one host keeps its rows as peers (its job's phases cancel
    there)."""
    z = np.full_like(x, np.nan)
    med_out = np.full_like(x, np.nan)
    for g in np.unique(labels[labels >= 0]):
        idx = np.flatnonzero(labels == g)
        if len(idx) < min_peers:
            continue
        hosts = np.unique(owners[idx]) if owners is not None else np.zeros(1, np.int64)
        parts = [(idx, idx)] if len(hosts) < 2 or owners is None else [
            (idx[owners[idx] == h], idx[owners[idx] != h]) for h in hosts
        ]  # fmt: skip
        for rows, peers in parts:
            med, cnt = nan_median(x[peers])
            mad, _ = nan_median(np.abs(x[peers] - med))
            with np.errstate(invalid="ignore"):
                zz = (x[rows] - med) / np.maximum(1.4826 * mad, 1.0)
            few = cnt < min_peers
            zz[:, few] = np.nan
            z[rows] = zz
            med_out[rows] = np.where(few, np.nan, med)
    return z, med_out


class AnomalyDetector:
    """The detector of one entity kind (see the module docstring). `step` takes one window;
    state is kept per entity id, so entities may come and go between windows."""

    def __init__(self, kind: Entity | str, config: DetectorConfig | None = None) -> None:
        self.kind = Entity(kind)
        self.cfg = config or DetectorConfig()
        sigs: tuple[Signal, ...] = signals_of(self.kind)
        self.signals = tuple(s.name for s in sigs)
        self._log = np.array([s.log for s in sigs])
        self._scale = np.array([s.scale for s in sigs], np.float64)
        self._dir = np.array([_DIRS[s.bad] for s in sigs])
        self._config = np.array([s.config for s in sigs])
        self._row: dict[str, int] = {}
        n_s = len(sigs)
        self._base = np.zeros((0, n_s))
        self._up = np.zeros((0, n_s))  # semi-deviations: above and below the normal
        self._dn = np.zeros((0, n_s))
        self._n = np.zeros((0, n_s), np.int64)
        self._group: list[str] = []
        self._streak = np.zeros(0, np.int64)
        self._quiet = np.zeros(0, np.int64)
        self._active = np.zeros(0, bool)
        self._since = np.zeros(0, np.int64)

    # ---- transforms -------------------------------------------------------------------------
    def transform(self, values: Array) -> Array:
        """Return values on the comparison scale (columns in catalogue order)."""
        with np.errstate(invalid="ignore"):
            lin = values / self._scale
            return np.where(self._log, np.log2(1.0 + np.maximum(lin, 0.0)), lin)

    def untransform(self, y: Array) -> Array:
        """Return comparison-scale values in published units."""
        with np.errstate(over="ignore", invalid="ignore"):
            return np.where(self._log, (np.exp2(y) - 1.0) * self._scale, y * self._scale)

    # ---- state ------------------------------------------------------------------------------
    def _rows(self, entities: Sequence[str]) -> npt.NDArray[np.intp]:
        new = [e for e in entities if e not in self._row]
        if new:
            k, n_s = len(new), len(self.signals)
            for e in new:
                self._row[e] = len(self._row)
                self._group.append("\0")
            self._base = np.vstack([self._base, np.zeros((k, n_s))])
            self._up = np.vstack([self._up, np.zeros((k, n_s))])
            self._dn = np.vstack([self._dn, np.zeros((k, n_s))])
            self._n = np.vstack([self._n, np.zeros((k, n_s), np.int64)])
            self._streak = np.concatenate([self._streak, np.zeros(k, np.int64)])
            self._quiet = np.concatenate([self._quiet, np.zeros(k, np.int64)])
            self._active = np.concatenate([self._active, np.zeros(k, bool)])
            self._since = np.concatenate([self._since, np.zeros(k, np.int64)])
        return np.array([self._row[e] for e in entities], np.intp)

    def active(self) -> tuple[str, ...]:
        """Return the entities now in an anomaly episode."""
        return tuple(e for e, r in self._row.items() if self._active[r])

    # ---- one window -------------------------------------------------------------------------
    def step(
        self,
        frame: SignalFrame,
        groups: Sequence[str],
        t_ns: int,
        shifted: Collection[str] = (),
        sites: Sequence[str] | None = None,
        hosts: Sequence[str] | None = None,
    ) -> WindowResult:
        """Score one window: ``frame`` of this detector's kind with the catalogue's signals as
        columns, ``groups[i]`` the peer group of ``frame.entities[i]`` ("" = none).
        ``shifted``: groups another kind saw change as a whole this window (a job's phase):
        their members without enough peers are not scored against their own normal alone.
        ``sites[i]`` (optional): where entity ``i`` sits (its leaf); whole-group moves are
        then also reported per group and site, as ``"<group>@<site>"``, and configuration
        signals are compared across the site. ``hosts[i]`` (optional): entity ``i``'s host;
        in a group of several hosts, an entity's peers are the other hosts' entities.

        Raises ValueError when the frame's kind, columns or group count do not match."""
        if frame.kind != self.kind or frame.signals != self.signals:
            raise ValueError(f"a {self.kind} detector needs the catalogue's {self.kind} signals")
        if len(groups) != len(frame.entities):
            raise ValueError("one peer group per entity")
        cfg = self.cfg
        rows = self._rows(frame.entities)
        for i, r in enumerate(rows):
            if self._group[r] != groups[i]:
                self._group[r] = groups[i]
                self._n[r] = 0  # a new peer group: a new normal
        names = sorted({g for g in groups if g})
        code = {g: k for k, g in enumerate(names)}
        labels = np.array([code.get(g, -1) for g in groups], np.int64)
        y = self.transform(frame.values)
        base, n = self._base[rows], self._n[rows]
        dev_up, dev_dn = self._up[rows], self._dn[rows]
        warm = n >= cfg.warmup
        d = np.where(warm, y - base, np.nan)
        # a rise is judged by how far the entity usually rises, a fall by how far it falls
        z_self = d / np.maximum(2.5 * np.where(d >= 0, dev_up, dev_dn), 1.0)
        own = None
        if hosts is not None:
            if len(hosts) != len(groups):
                raise ValueError("one host per entity")
            hcode = {h: k for k, h in enumerate(sorted(set(hosts)))}
            own = np.array([hcode[h] for h in hosts], np.int64)
        z_pd, med_d = _peer_z(d, labels, cfg.min_peers, own)
        z_py, med_y = _peer_z(y, labels, cfg.min_peers, own)
        if sites is not None:  # configuration should be the same for every NIC of a leaf
            scode = {st: k for k, st in enumerate(sorted(set(sites)))}
            slabels = np.array([scode[st] if st else -1 for st in sites], np.int64)
            z_cfg, _ = _peer_z(y, slabels, cfg.min_peers, own)
            z_py = np.where(self._config, z_cfg, z_py)
        # how far each group moved together, in any signal (context ones too: a job's GPUs
        # going idle is the clearest sign of its phase)
        moved = np.nan_to_num(np.abs(med_d), nan=0.0)
        row_shift = moved.max(axis=1) if moved.size else np.zeros(len(rows))
        shifts = {g: float(row_shift[i]) for i, g in enumerate(groups) if g}
        solo_ok = np.array([g not in shifted for g in groups], bool)[:, None]

        def directed(z: Array) -> Array:
            up = np.where(self._dir == 2, np.abs(z), z * self._dir)
            return np.nan_to_num(np.maximum(up, 0.0), nan=0.0)

        s_self, s_pd, s_py = directed(z_self), directed(z_pd), directed(z_py)
        subsets = [(g, labels == k) for k, g in enumerate(names)]
        if sites is not None:
            if len(sites) != len(groups):
                raise ValueError("one site per entity")
            pairs = sorted({(g, st) for g, st in zip(groups, sites, strict=True) if g and st})
            subsets += [(f"{g}@{st}", np.array([a == g and b == st for a, b in zip(groups, sites, strict=True)]))
                        for g, st in pairs]  # fmt: skip
        moves = self._group_moves(frame, subsets, s_self, base, warm)
        solo = np.where(solo_ok, s_self, 0.0)
        warm_score = np.where(np.isnan(z_pd), solo, np.minimum(s_self, s_pd))
        score = np.where(self._config, s_py, np.where(warm, warm_score, 0.0))
        score[:, self._dir == 0] = 0.0
        score[np.isnan(y)] = 0.0
        ent = score.max(axis=1) if score.size else np.zeros(len(rows))
        over = ent >= cfg.threshold
        self._streak[rows] = np.where(over, self._streak[rows] + 1, 0)
        self._quiet[rows] = np.where(over, 0, self._quiet[rows] + 1)
        started = ~self._active[rows] & (self._streak[rows] >= cfg.persist)
        ended = self._active[rows] & (self._quiet[rows] >= cfg.clear)
        self._active[rows[started]] = True
        self._since[rows[started]] = t_ns
        self._active[rows[ended]] = False
        # the own normal learns from windows that were not anomalous
        learn = ~(over | self._active[rows])[:, None] & ~np.isnan(y)
        col = {n: j for j, n in enumerate(self.signals)}
        member = dict(subsets)
        for g, tops in moves.items():  # what a whole group moved is not learned either
            learn[np.ix_(member[g], [col[c.signal] for c in tops])] = False
        a = cfg.alpha
        first = learn & (n == 0)
        lim = cfg.clip * np.maximum(1.25 * (dev_up + dev_dn), 1.0)
        r_ = np.clip(np.nan_to_num(y - base), -lim, lim)
        self._base[rows] = np.where(first, y, np.where(learn, base + a * r_, base))
        for arr, part in ((self._up, np.maximum(r_, 0.0)), (self._dn, np.maximum(-r_, 0.0))):
            old = arr[rows]
            arr[rows] = np.where(first, 0.0, np.where(learn, old + a * (part - old), old))
        self._n[rows] = n + learn
        out_active, new = [], []
        for k in np.flatnonzero(self._active[rows]).tolist():
            got = self._anomaly(frame, k, int(rows[k]), score, base, warm, med_y, t_ns)
            out_active.append(got)
            if started[k]:
                new.append(got)
        gone = tuple(frame.entities[i] for i in np.flatnonzero(ended))
        return WindowResult(tuple(new), tuple(out_active), gone, shifts, moves)

    def _group_moves(
        self,
        frame: SignalFrame,
        subsets: Sequence[tuple[str, npt.NDArray[np.bool_]]],
        s_self: Array,
        base: Array,
        warm: npt.NDArray[np.bool_],
    ) -> dict[str, tuple[Contributor, ...]]:
        """Return per peer group the signals its members moved *together*, in the direction
        that means trouble: the median over members with a normal of their own-normal score
        at least half the threshold (what peers cancel: a fault every member shares)."""
        cfg = self.cfg
        out: dict[str, tuple[Contributor, ...]] = {}
        scored = np.flatnonzero((self._dir != 0) & ~self._config)
        for name, mask in subsets:
            idx = np.flatnonzero(mask)
            w = warm[idx][:, scored]
            if len(idx) < cfg.min_peers:
                continue
            med, cnt = nan_median(np.where(w, s_self[idx][:, scored], np.nan))
            enough = cnt >= cfg.min_peers
            order = np.argsort(-np.nan_to_num(med))
            hit = [k for k in order if enough[k] and med[k] >= cfg.threshold / 2]
            if not hit:
                continue
            tops = []
            for k in hit[: cfg.top]:
                j = int(scored[k])
                value = float(nan_median(frame.values[idx, j][:, None])[0][0])
                norm = float(nan_median(self.untransform(base[idx])[:, j][:, None])[0][0])
                tops.append(
                    Contributor(self.signals[j], round(float(med[k]), 2), value, norm, None)
                )
            out[name] = tuple(tops)
        return out

    def _anomaly(
        self,
        frame: SignalFrame,
        i: int,
        r: int,
        score: Array,
        base: Array,
        warm: npt.NDArray[np.bool_],
        med_y: Array,
        t_ns: int,
    ) -> Anomaly:
        cfg = self.cfg
        row = score[i]
        order = [j for j in np.argsort(-row) if row[j] >= cfg.contrib][: cfg.top]
        normal = self.untransform(base[i][None, :])[0]
        peers = self.untransform(med_y[i][None, :])[0]
        tops = tuple(
            Contributor(
                signal=self.signals[j],
                score=round(float(row[j]), 2),
                value=float(frame.values[i, j]),
                normal=float(normal[j]) if warm[i, j] else None,
                peers=None if math.isnan(peers[j]) else float(peers[j]),
            )
            for j in order
        )
        return Anomaly(t_ns, self.kind, frame.entities[i], round(float(row.max()), 2),
                       int(self._since[r]), tops)  # fmt: skip
