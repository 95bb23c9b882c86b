"""Per-interval delay and loss statistics from `Observations` (pure; time passed in).

`IntervalStats.observe(obs)` folds one batch of probe outcomes into the open interval:
delay samples (forward and reply direction, each a one-way delay of a directed NIC pair on
one path) and per-path probe and loss counts, all with array code. `close()` ends the
interval and returns an `IntervalSummary`:

- per directed NIC pair: p50 and p99 one-way delay, p99 queueing delay (one-way delay minus
  the path's propagation baseline), sample count;
- per switch path (the sequence of switches, e.g. ``leaf0>spine1>leaf2``: NIC links left out
  so the label is shared by every NIC pair of the two leaves; or only the top switch, see
  `PATH_DETAIL`): p50/p99 delay, probes, lost;
- per link: probe crossings and lost crossings (a probe counts against every link of its
  forward and reply paths; the localized verdict is the link state, not this ratio).

Percentiles are exact over the samples kept. At most ``max_samples`` delay samples are kept
per interval; past that the interval keeps every 2nd, then every 4th... sample (stride
doubles, the kept set is halved), so memory is bounded under any ingest rate and the kept
samples stay a uniform subsample. Baselines: the minimum delay per path, allowed to creep up
by ``drift`` per second (the brain's rule, `controller.detect.paths.PathIndex.fold`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.detect.paths import PathIndex, expand, path_signature
from controller.observations import Observations
from mesh.fabric import Fabric
from mesh.fabric.model import SWITCH_TIER, NodeKind

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class IntervalSummary:
    """Statistics of one interval ``[start_ns, end_ns)``; arrays are parallel per row."""

    start_ns: int
    end_ns: int
    pair_src: I32
    pair_dst: I32
    pair_p50_ns: F64
    pair_p99_ns: F64
    pair_queue_p99_ns: F64
    pair_samples: I64
    path_label: tuple[str, ...]
    path_p50_ns: F64  # NaN where the path had no delay sample
    path_p99_ns: F64
    path_probes: I64
    path_lost: I64
    link_probes: I64  # per fabric link index
    link_lost: I64


#: How switch paths are labelled: ``full`` the switch sequence (``leaf0>spine1>leaf2``),
#: ``top`` only the highest switch crossed (``spine1``: few series at 10,000 NICs),
#: ``off`` no per-path series (link loss is still counted).
PATH_DETAIL = ("full", "top", "off")

_OFF = 1 << 31  # values are kept as ns + 2**31 in the low 32 bits of a sort key
_LOW = np.int64((1 << 32) - 1)


def _quantiles(group: I64, values: F64, qs: tuple[float, ...]) -> tuple[I64, I64, list[F64]]:
    """Return (groups, counts, [per-group quantile q for q in qs]) by nearest rank.

    Values are rounded to whole ns and clipped to +-2.1 s; one int64 sort of
    ``group << 32 | value`` orders them (groups must be < 2**31)."""
    if not len(group):
        e = np.zeros(0, np.float64)
        return np.zeros(0, np.int64), np.zeros(0, np.int64), [e.copy() for _ in qs]
    q = np.clip(np.rint(values) + _OFF, 0, (1 << 32) - 1).astype(np.int64)
    key = np.sort((group.astype(np.int64) << 32) | q)
    g = key >> 32
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    counts = np.diff(np.r_[starts, len(g)])
    out = [
        ((key[starts + np.floor(qq * (counts - 1) + 0.5).astype(np.int64)] & _LOW) - _OFF).astype(
            np.float64
        )
        for qq in qs
    ]
    return g[starts], counts.astype(np.int64), out


@dataclass(frozen=True, eq=False)
class RawInterval:
    """One interval's accumulated samples and counts, cut from `IntervalStats` (cheap) so
    that `summarize` (the sorting) can run elsewhere, e.g. in a worker thread."""

    start_ns: int
    end_ns: int
    n_nics: int
    n_links: int
    chunks: tuple[tuple[I64, I64, F64], ...]  # pair key, path number, owd
    counts: I64  # 4 x paths: probes, lost (forward direction), probes, lost (reply)
    label_of: I64  # path number -> switch-path label number (-1: unknown path)
    labels: tuple[str, ...]
    hops: I32  # per path number
    base: F64  # per path number: propagation baseline during the interval (inf: none yet)


def summarize(raw: RawInterval) -> tuple[IntervalSummary, F64]:
    """Return the interval's summary and the per-path minimum delay (inf where unseen) to
    fold into the baselines (`IntervalStats.fold`). Pure; reads only ``raw``."""
    n = raw.n_nics
    if raw.chunks:
        key = np.concatenate([c[0] for c in raw.chunks])
        path = np.concatenate([c[1] for c in raw.chunks])
        owd = np.concatenate([c[2] for c in raw.chunks])
    else:
        key = path = np.zeros(0, np.int64)
        owd = np.zeros(0, np.float64)
    pk, pcount, (p50, p99) = _quantiles(key, owd, (0.5, 0.99))
    inside = (path >= 0) & (path < len(raw.base))
    base = np.full(len(path), np.inf)
    base[inside] = raw.base[path[inside]]
    qok = np.isfinite(base)
    queue = np.maximum(owd[qok] - base[qok], 0.0)
    qk, _, (q99,) = _quantiles(key[qok], queue, (0.99,))
    pair_q = np.full(len(pk), np.nan)
    pair_q[np.searchsorted(pk, qk)] = q99
    size = len(raw.label_of)
    nlab = len(raw.labels)

    def fit(a: I64) -> I64:
        out = np.zeros(size, np.int64)
        out[: min(size, len(a))] = a[:size]
        return out

    probes, lost, rprobes, rlost = (fit(c) for c in np.split(raw.counts, 4))
    has_s = (path >= 0) & (path < size)
    lab_s = np.full(len(path), -1, np.int64)
    lab_s[has_s] = raw.label_of[path[has_s]]
    sel = lab_s >= 0
    lk, _, (l50, l99) = _quantiles(lab_s[sel], owd[sel], (0.5, 0.99))
    path_p50 = np.full(nlab, np.nan)
    path_p99 = np.full(nlab, np.nan)
    path_p50[lk], path_p99[lk] = l50, l99
    lab = raw.label_of
    has = lab >= 0
    path_probes = np.bincount(lab[has], weights=probes[has], minlength=nlab).astype(np.int64)
    path_lost = np.bincount(lab[has], weights=lost[has], minlength=nlab).astype(np.int64)
    hops = raw.hops[:size]
    link_probes = expand(probes + rprobes, hops, raw.n_links, links=True)
    link_lost = expand(lost + rlost, hops, raw.n_links, links=True)
    wmin = np.full(size, np.inf)
    np.minimum.at(wmin, path[has_s], owd[has_s])
    summary = IntervalSummary(
        raw.start_ns,
        raw.end_ns,
        (pk // n).astype(np.int32),
        (pk % n).astype(np.int32),
        p50,
        p99,
        pair_q,
        pcount,
        raw.labels,
        path_p50,
        path_p99,
        path_probes,
        path_lost,
        link_probes,
        link_lost,
    )
    return summary, wmin


class IntervalStats:
    """Accumulates one interval of probe outcomes for a fabric. One owner, not thread-safe."""

    def __init__(
        self,
        fabric: Fabric,
        width: int,
        *,
        max_samples: int = 4_000_000,
        drift: float = 50.0,
        start_ns: int = 0,
        path_detail: str = "full",
    ) -> None:
        if max_samples < 2:
            raise ValueError("max_samples must be >= 2")
        if path_detail not in PATH_DETAIL:
            raise ValueError(f"path detail must be one of {', '.join(PATH_DETAIL)}")
        self.path_detail = path_detail
        self.fabric = fabric
        self.max_samples = max_samples
        self.drift = drift
        self.paths = PathIndex(width)
        self._label_of: I64 = np.zeros(0, np.int64)  # path number -> switch-path label number
        self._labels: dict[str, int] = {}
        self._kind_switch = {n.id for n in fabric.nodes if n.kind != NodeKind.HOST}
        n_links = len(fabric.links)
        self._is_nic_link = np.zeros(n_links + 1, bool)  # last entry: padding hop -1
        self._is_nic_link[np.asarray(fabric.nic_link, np.int64)] = True
        sw_index = {n.id: i for i, n in enumerate(fabric.switches)}
        self._upper_switch = np.array(
            [sw_index.get(lk.upper, -1) for lk in fabric.links] + [-1], np.int32
        )
        self._key_label: dict[int, int] = {}  # label key signature -> label number (-1: none)
        self._unknown_sig = path_signature(np.full((1, width), -1, np.int32))
        self._start = start_ns
        self._last_close: int | None = None
        self._reset()

    def _reset(self) -> None:
        self._chunks: list[tuple[I64, I64, F64]] = []  # pair key, path, owd
        self._n = 0
        self._stride = 1
        self._phase = 0
        self._codes: list[I64] = []  # pending counter codes (4 * path + counter), see _flush
        self._ncodes = 0
        self._acc = np.zeros(0, np.int64)  # 4 per path: fwd probes, fwd lost, rev probes, lost

    # ---- labels --------------------------------------------------------------------------
    def _label(self, hops: I32) -> str:
        f = self.fabric
        nodes: list[str] = []
        for h in hops.tolist():
            if h < 0:
                continue
            lk = f.links[h >> 1]
            a, b = (lk.upper, lk.lower) if h & 1 else (lk.lower, lk.upper)
            if not nodes:
                nodes.append(a)
            nodes.append(b)
        sw = [n for n in nodes if n in self._kind_switch]
        if self.path_detail == "top" and sw:
            tier = {n.id: SWITCH_TIER.get(n.kind, 0) for n in f.nodes}
            return max(sw, key=tier.__getitem__)
        return ">".join(sw)

    def _grow_labels(self) -> None:
        """Give new paths their label number. Paths are grouped by a key that fixes the label
        (their switch-link hops, and the leaf of their first NIC link), vectorized; only a key
        never seen before builds its label string."""
        old = len(self._label_of)
        new = self.paths.size
        if new == old:
            return
        rows = self.paths.hops[old:new]
        lk = np.where(rows >= 0, rows >> 1, -1)  # -1 indexes the padding entry
        nic = self._is_nic_link[lk]
        masked = np.where(nic, -1, rows)
        first_leaf = np.where(nic[:, 0], self._upper_switch[lk[:, 0]], -1)
        sig = path_signature(np.hstack([masked, first_leaf[:, None]]).astype(np.int32))
        uniq, first, inv = np.unique(sig, return_index=True, return_inverse=True)
        labs = np.empty(len(uniq), np.int64)
        for j, (key, at) in enumerate(zip(uniq.tolist(), first.tolist(), strict=True)):
            lab = self._key_label.get(key)
            if lab is None:
                text = self._label(rows[at])
                known = bool(text) and self.path_detail != "off"
                lab = self._labels.setdefault(text, len(self._labels)) if known else -1
                self._key_label[key] = lab
            labs[j] = lab
        self._label_of = np.concatenate([self._label_of, labs[inv.reshape(-1)]])

    # ---- input ---------------------------------------------------------------------------
    def observe(self, obs: Observations) -> None:
        """Fold ``obs`` into the open interval (both directions of every probe)."""
        if not len(obs):
            return
        n = len(self.fabric.nics)
        pf = self.paths.paths(obs.hops_fwd)
        pr = self.paths.paths(obs.hops_rev)
        self._grow_labels()
        unknown = int(self.paths.lookup(self._unknown_sig)[0])  # the all -1 row, if seen
        known_f, known_r = pf != unknown, pr != unknown
        lost = obs.lost
        # one code per (record, counter): 4 * path + (0 probe | 1 lost) (+ 2 for the reply)
        codes = np.concatenate(
            [4 * pf[known_f], 4 * pf[known_f & lost] + 1,
             4 * pr[known_r] + 2, 4 * pr[known_r & lost] + 3]
        )  # fmt: skip
        self._codes.append(codes)
        self._ncodes += len(codes)
        if self._ncodes >= 1 << 21:
            self._flush()
        src = obs.src.astype(np.int64)
        dst = obs.dst.astype(np.int64)
        key = np.concatenate([src * n + dst, dst * n + src])
        path = np.concatenate([np.where(known_f, pf, -1), np.where(known_r, pr, -1)])
        owd = np.concatenate([obs.owd_fwd_ns, obs.owd_rev_ns])
        ok = np.isfinite(owd)
        key, path, owd = key[ok], path[ok], owd[ok]
        if self._stride > 1:
            keep = (np.arange(len(key)) + self._phase) % self._stride == 0
            self._phase = (self._phase + len(key)) % self._stride
            key, path, owd = key[keep], path[keep], owd[keep]
        self._chunks.append((key, path, owd))
        self._n += len(key)
        while self._n > self.max_samples:
            self._halve()

    def _flush(self) -> None:
        """Fold pending counter codes into the per-path counters (one bincount per ~2 M
        codes, so memory stays bounded and small batches do not each pay a full pass)."""
        size = 4 * self.paths.size
        if len(self._acc) < size:
            self._acc = np.concatenate([self._acc, np.zeros(size - len(self._acc), np.int64)])
        if self._codes:
            codes = np.concatenate(self._codes)
            self._acc += np.bincount(codes, minlength=size)[:size]
        self._codes, self._ncodes = [], 0

    def _halve(self) -> None:
        chunks = [tuple(c[::2] for c in ch) for ch in self._chunks]
        self._chunks = chunks  # type: ignore[assignment]
        self._n = sum(len(c[0]) for c in self._chunks)
        self._stride *= 2
        self._phase = 0

    # ---- output --------------------------------------------------------------------------
    def cut(self, now_ns: int) -> RawInterval:
        """End the interval at ``now_ns`` and return its raw data (no sorting; O(paths))."""
        size = self.paths.size
        self._flush()
        counts = np.ascontiguousarray(self._acc.reshape(size, 4).T).reshape(-1)
        raw = RawInterval(
            self._start,
            now_ns,
            len(self.fabric.nics),
            len(self.fabric.links),
            tuple(self._chunks),
            counts,
            self._label_of[:size],
            tuple(sorted(self._labels, key=self._labels.__getitem__)),
            self.paths.hops[:size],
            self.paths.base[:size].copy(),
        )
        self._start = now_ns
        self._reset()
        return raw

    def fold(self, end_ns: int, wmin: F64) -> None:
        """Fold an interval's per-path minimum delays (from `summarize`) into the baselines."""
        dt_s = 0.0 if self._last_close is None else (end_ns - self._last_close) / 1e9
        self._last_close = end_ns
        self.paths.fold(wmin, dt_s, self.drift)

    def close(self, now_ns: int) -> IntervalSummary:
        """End the interval at ``now_ns``; return its summary (cut, summarize, fold)."""
        summary, wmin = summarize(self.cut(now_ns))
        self.fold(now_ns, wmin)
        return summary
