"""Sync on real kernel timestamps through the namespace fabric, against virtual clocks.

``python -m testbed.bench_sync_real [--json]`` (root): builds a small fabric (2 leaves x 2
hosts, 2 spines), gives every host a `VirtualClock` (offset up to +-1 ms, drift up to +-30 ppm),
sends coded probe pairs over several source ports between every NIC pair with software kernel
timestamps (`testbed.netns.probe`), maps the stamps through the virtual clocks and recovers the
offsets with `sync.window` (coded filter, pair fits, network solve). Windows run idle, then with
``leaf0-spine0`` congested both ways. Baseline on the same probes: NTP-style min-RTT offsets
(`sync.ntp_offsets`). Errors are node offsets minus truth, both relative to their mean, at the
window's reference instant; pair errors compare theta_ij = offset_j - offset_i.
"""

from __future__ import annotations

import argparse
import secrets
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from contract.interrupt import finish, interruptible
from mesh.fabric import FabricShape
from sync import ntp_offsets
from sync.window import orient_samples, sync_window
from testbed import faults
from testbed.clockerr import node_errors
from testbed.netns.lifecycle import up
from testbed.netns.probe import Endpoint, coded_round_trips
from testbed.netns.teardown import tear_down
from testbed.vclock import VirtualClock, assign_clocks

SPORTS = (42000, 42001, 42002, 42003)


def _window(
    eps: dict[str, Endpoint], inits: dict[tuple[str, int], Endpoint], nics: list[str],
    rounds: int, seq0: int,
) -> dict[str, np.ndarray]:  # fmt: skip
    rows: list[tuple[int, int, int, int, int, int, int, int]] = []
    seq, pid = seq0, 0
    for _ in range(rounds):
        for i, a in enumerate(nics):
            for j, b in enumerate(nics):
                if i == j:
                    continue
                for sp in SPORTS:
                    res = coded_round_trips(inits[(a, sp)], eps[b], seq, timeout_s=0.05)
                    seq += 2
                    for r in res:
                        if r is not None:
                            rows.append((i, j, pid, *r, 0))
                        else:
                            rows.append((i, j, pid, 0, 0, 0, 0, 1))
                    pid += 1
    arr = np.array(rows, dtype=np.int64)
    cols = ("src", "dst", "pair", "t1", "t2", "t3", "t4", "lost")
    return {c: arr[:, k] for k, c in enumerate(cols)}


def window_errors(
    w: dict[str, np.ndarray], clocks: list[VirtualClock], coded_tol_ns: int
) -> dict[str, list[float]]:
    """Sync one window of kernel-stamped probes (columns ``w``) seen through ``clocks``; return
    per-window error lists (node offsets, pair thetas, NTP-style baseline) against the truth."""
    n = len(clocks)
    src, dst, lost = w["src"], w["dst"], w["lost"].astype(bool)
    k = ~lost
    t1, t2, t3, t4 = (w[c].copy() for c in ("t1", "t2", "t3", "t4"))
    for c in range(n):  # map kernel stamps through the virtual clocks
        m_s, m_d = k & (src == c), k & (dst == c)
        t1[m_s], t4[m_s] = clocks[c].apply_array(t1[m_s]), clocks[c].apply_array(t4[m_s])
        t2[m_d], t3[m_d] = clocks[c].apply_array(t2[m_d]), clocks[c].apply_array(t3[m_d])
    t_kernel_ref = int(np.median(w["t1"][k]))
    t_ref = int(np.median(t1[k]))
    samples = orient_samples(
        src, dst, w["pair"], t1, t2, t3, t4, lost, t_ref, coded_tol_ns=coded_tol_ns
    )
    sol = sync_window(n, samples, bias_bound=False)  # kernel stamps: see sync_window
    truth = np.array([c.offset_at(t_kernel_ref) for c in clocks])
    est = np.where(sol.known, sol.offset_ns, np.nan)
    e_node = node_errors(est, truth)  # known NICs only, median-centred (testbed.clockerr)
    iu = np.triu_indices(n, 1)
    e_pair_h = (est[iu[1]] - est[iu[0]]) - (truth[iu[1]] - truth[iu[0]])
    # NTP baseline per ordered pair: min-RTT exchange, error vs truth at that exchange
    op = src * n + dst
    ntp = ntp_offsets(n * n, op[k], t1[k], t2[k], t3[k], t4[k], t_ref)
    e_ntp = []
    for p in np.flatnonzero(ntp.ok):
        a, b = divmod(int(p), n)
        t_ex = t_kernel_ref + int(ntp.t_rel_ns[p])
        e_ntp.append(
            float(ntp.theta_ns[p] - (clocks[b].offset_at(t_ex) - clocks[a].offset_at(t_ex)))
        )
    return {
        "node": [float(x) for x in e_node if np.isfinite(x)],
        "pair": [float(x) for x in e_pair_h if np.isfinite(x)],
        "ntp_pair": e_ntp,
        "lost": [float(lost.mean())],
        "unknown": [float(np.isnan(e_node).sum())],
    }


def summarize_errors(errs: list[dict[str, list[float]]]) -> dict[str, float]:
    """Return p50/p99 figures (ns) over the error lists of several windows."""

    def cat(key: str) -> np.ndarray:
        out: np.ndarray = np.abs(np.concatenate([np.asarray(e[key]) for e in errs]))
        return out

    node, pair, ntp = cat("node"), cat("pair"), cat("ntp_pair")
    return {
        "p50_ns": float(np.percentile(node, 50)),
        "p99_ns": float(np.percentile(node, 99)),
        "pair_p99_ns": float(np.percentile(pair, 99)),
        "ntp_pair_p50_ns": float(np.percentile(ntp, 50)),
        "ntp_pair_p99_ns": float(np.percentile(ntp, 99)),
        "ratio_ntp_over_huygens_pair_p99": float(
            np.percentile(ntp, 99) / max(np.percentile(pair, 99), 1e-9)
        ),
        "windows": float(len(errs)),
        "unknown_nics_max": float(max((e.get("unknown", [0.0])[0] for e in errs), default=0.0)),
        "loss_fraction": float(np.mean([e["lost"][0] for e in errs])),
    }


def bench(
    windows: int, rounds: int, seed: int, rate_mbit: float, coded_tol_ns: int
) -> dict[str, Any]:
    """Run the benchmark; return the JSON-ready figures (idle and congested)."""
    prefix = "b" + secrets.token_hex(3) + "-"
    fabric, plan = up(FabricShape(leaves=2, hosts_per_leaf=2, spines=2), prefix)
    eps: dict[str, Endpoint] = {}
    inits: dict[tuple[str, int], Endpoint] = {}
    try:
        nics = [n.id for n in fabric.nics]
        for n in fabric.nics:
            ns = plan.node_ns[n.host]
            eps[n.id] = Endpoint.open(ns, n.address, 4791)
            for sp in SPORTS:
                inits[(n.id, sp)] = Endpoint.open(ns, n.address, sp)
        hosts = assign_clocks([h.id for h in fabric.hosts], seed=seed, t0_ns=time.time_ns())
        clocks = [hosts[n.host] for n in fabric.nics]
        out: dict[str, Any] = {"shape": "2 leaves x 2 hosts x 1 NIC, 2 spines", "seed": seed}
        seq = 1
        idle = []
        for _ in range(windows):
            w = _window(eps, inits, nics, rounds, seq)
            seq += len(w["src"]) + 2
            idle.append(window_errors(w, clocks, coded_tol_ns))
        out["idle"] = summarize_errors(idle)
        procs = faults.start_congestion(plan, "leaf0-spine0", rate_mbit, seconds=3600)
        try:
            time.sleep(1.0)
            busy = []
            for _ in range(windows):
                w = _window(eps, inits, nics, rounds, seq)
                seq += len(w["src"]) + 2
                busy.append(window_errors(w, clocks, coded_tol_ns))
        finally:
            for p in procs:
                p.kill()
                p.wait()
        out["congested"] = summarize_errors(busy)
        out["congested"]["congest_rate_mbit"] = rate_mbit
        out["probes_per_window"] = rounds * len(nics) * (len(nics) - 1) * len(SPORTS) * 2
        return out
    finally:
        for ep in [*eps.values(), *inits.values()]:
            ep.close()
        tear_down(prefix)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; print the figures (JSON with --json)."""
    p = argparse.ArgumentParser(prog="python -m testbed.bench_sync_real", description=__doc__)
    p.add_argument("--windows", type=int, default=6)
    p.add_argument("--rounds", type=int, default=40, help="probe rounds per window")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rate-mbit", type=float, default=150.0, help="congestion generator rate")
    p.add_argument("--coded-tol-ns", type=int, default=1000)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    res: dict[str, Any] | None = None
    with interruptible() as stop:  # the figures come at the end: none if stopped before
        res = bench(a.windows, a.rounds, a.seed, a.rate_mbit, a.coded_tol_ns)
    return finish(stop, res, as_json=a.json, show=_show, indent=1)


def _show(res: Mapping[str, Any]) -> None:
    for k in ("idle", "congested"):
        r = res[k]
        print(
            f"{k}: Huygens node p50 {r['p50_ns']:.0f} ns p99 {r['p99_ns']:.0f} ns, pair p99 "
            f"{r['pair_p99_ns']:.0f} ns; NTP pair p99 {r['ntp_pair_p99_ns']:.0f} ns"
        )


if __name__ == "__main__":
    raise SystemExit(main())
