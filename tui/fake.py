"""A seeded, deterministic `SnapshotSource` for tests, snapshots, the benchmark and
``qpmesh tui --fake``: a fabric with one NIC down, one flapping, one contended, a few slow
NICs, per-pair delays, per-spine path delays, events, GPU health and a history per NIC.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from mesh.fabric import Fabric, FabricShape, build_fabric
from mesh.snapshot import ControlUnavailable, GpuHealth, Health, MeshSnapshot

T0_NS = 1_700_000_000_000_000_000


class FakeSource:
    """Deterministic source. ``control`` None: Control unavailable (set_control raises).

    ``advance(dt_s)`` moves time on and re-draws delays (seeded), as a live source would.
    """

    def __init__(
        self,
        fabric: Fabric | None = None,
        *,
        seed: int = 1,
        control: bool | None = False,
        jobs: tuple[dict[str, object], ...] | None = None,
        peers: int = 8,
    ) -> None:
        self.fabric = fabric or build_fabric(FabricShape(leaves=4, hosts_per_leaf=8, spines=4))
        self.seed = seed
        self.control = control
        self.jobs = jobs
        self.t_s = 60.0
        self._tick = 0
        n = len(self.fabric.nics)
        rng = np.random.default_rng(seed)
        k = min(peers, n - 1)
        self.owd_src = np.repeat(np.arange(n, dtype=np.int32), k)
        self.owd_dst = ((self.owd_src + 1 + np.tile(np.arange(k), n)) % n).astype(np.int32)
        self.spines = [s.id for s in self.fabric.switches if s.id.startswith("spine")]
        self._base = rng.uniform(1_500.0, 3_500.0, n)
        self._snap = self._build()

    def _build(self) -> MeshSnapshot:
        fab = self.fabric
        n = len(fab.nics)
        rng = np.random.default_rng(self.seed * 1000 + self._tick)
        down, flap, cont, slow = 3 % n, 10 % n, 17 % n, (5 % n, 22 % n)
        health = [Health.UP] * n
        health[down] = Health.DOWN
        health[flap] = Health.FLAPPING
        health[cont] = Health.CONTENDED
        per_nic = self._base * rng.uniform(0.95, 1.05, n)
        owd = (per_nic[self.owd_src] + per_nic[self.owd_dst]) / 2
        owd[self.owd_dst == slow[0]] += 6_000.0  # slow inbound only: the alerts toggle shows it
        owd[(self.owd_src == slow[1]) | (self.owd_dst == slow[1])] += 5_000.0
        owd[(self.owd_src == cont) | (self.owd_dst == cont)] += 9_000.0
        owd[(self.owd_src == down) | (self.owd_dst == down)] = np.nan
        worst_in = np.full(n, np.nan)
        worst_out = np.full(n, np.nan)
        ok = ~np.isnan(owd)
        np.fmax.at(worst_out, self.owd_src[ok], owd[ok])
        np.fmax.at(worst_in, self.owd_dst[ok], owd[ok])
        path_owd = {}
        for i in (0, 1, cont):
            for j in np.flatnonzero(self.owd_src == i)[:3]:
                base = float(owd[j])
                path_owd[(int(i), int(self.owd_dst[j]))] = {
                    sp: base * (1.6 if (i == cont and k == 1) else 1.0 + 0.02 * k)
                    for k, sp in enumerate(self.spines)
                }
        t_ns = T0_NS + int(self.t_s * 1e9)
        flap_link = f"leaf{fab.nics[flap].leaf[4:]}-spine1" if self.spines else fab.links[0].id
        events = (
            EventDoc(t_ns - 50_000_000_000, "link_flap", flap_link, "down 1.0 s", "critical"),
            EventDoc(
                t_ns - 30_000_000_000,
                "contention",
                f"{fab.nics[cont].leaf}-spine1",
                "3 flows over 1 link",
                "warning",
            ),
            EventDoc(
                t_ns - 20_000_000_000, "nic_down", fab.nics[down].id, "no replies", "critical"
            ),
            EventDoc(
                t_ns - 10_000_000_000,
                "remediation",
                fab.nics[down].id,
                "exclude from NCCL_IB_HCA",
                "info",
            ),
        )
        gpu = {h.id: GpuHealth(present=True) for h in fab.hosts}
        gpu[fab.nics[cont].host] = GpuHealth(present=True, ok=False, detail="Xid 79")
        return MeshSnapshot(
            t_ns=t_ns,
            fabric=fab,
            nic_health=tuple(health),
            worst_in_ns=worst_in,
            worst_out_ns=worst_out,
            owd_src=self.owd_src,
            owd_dst=self.owd_dst,
            owd_ns=owd,
            clock_offset_ns=np.linspace(-40_000.0, 40_000.0, n),
            clock_uncertainty_ns=np.full(n, 12.0),
            link_health={flap_link: Health.FLAPPING},
            flap_counts={flap_link: 4},
            path_owd=path_owd,
            events=events,
            gpu=gpu,
            throughput_bps=312.5e9,
            control_enabled=self.control,
            jobs=self.jobs,
        )

    def advance(self, dt_s: float) -> None:
        """Move time on by ``dt_s`` and redraw the delays."""
        self.t_s += dt_s
        self._tick += 1
        self._snap = self._build()

    # ---- SnapshotSource -----------------------------------------------------------------
    def snapshot(self) -> MeshSnapshot:
        """Return the current snapshot."""
        return self._snap

    def history(
        self, nic: int, window_s: float
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Return a deterministic worst-delay history of ``nic`` (one point per second)."""
        span = min(window_s, self.t_s)
        t = np.arange(-span, 0.0, 1.0)
        base = float(self._base[nic])
        v = base * (1.0 + 0.2 * np.sin(t / 7.0 + nic))
        v[(t > -40) & (t < -30)] *= 4.0  # an excursion over the threshold
        return t, v

    def set_control(self, enabled: bool) -> None:
        """Turn Control on/off; raise `ControlUnavailable` when built with ``control=None``."""
        if self.control is None:
            raise ControlUnavailable("this source has no Control (read-only controller)")
        self.control = enabled
        self._snap = self._build()
