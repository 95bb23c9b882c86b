"""The cross-layer graph of one job: job -> ranks -> GPUs and NICs -> NIC links -> leaves ->
uplinks -> spines, from what qpmesh knows (the job registry's ranks and NICs, the fabric).

Nodes are ids with a layer (``job``, ``rank``, ``host``, ``gpu``, ``nic``, ``link``,
``switch``); edges point down the layers. A rank's GPU is the one beside its NIC: NIC port
``p`` of a host is paired with GPU ``p`` (the usual one-NIC-per-GPU, PCIe-affine layout; the
job registry does not record GPUs). Paths between ranks are not enumerated: NCCL's queue
pairs spread over every uplink of a leaf, so the graph reaches every uplink of the job's
leaves, and mesh findings name the ones that matter. `neighbours` are the other NICs under
the job's leaves: a pause storm or a misconfigured host there reaches the job through the
leaf's buffers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from contract.signals import gpu_id
from controller.jobs import Job
from mesh.fabric import Fabric, FabricError

LAYERS = ("job", "rank", "host", "gpu", "nic", "link", "switch")


@dataclass(frozen=True)
class CrossLayerGraph:
    """One job's graph (build it with `build_graph`)."""

    job: str
    layer: Mapping[str, str]
    edges: Mapping[str, tuple[str, ...]]
    rank_of_nic: Mapping[str, int]
    nic_host: Mapping[str, str]  # the job's NICs and their neighbours'
    nic_gpu: Mapping[str, str]
    nic_link: Mapping[str, str]
    nic_leaf: Mapping[str, str]
    leaf_nics: Mapping[str, tuple[str, ...]]
    uplinks: Mapping[str, tuple[str, ...]]
    hop_link: Mapping[str, str]  # "a->b" (either way) and the link id -> link id

    def link(self, target: str) -> str | None:
        """Return the link id a finding's target names (a link id or a directed hop
        ``a->b`` of a link in this graph), or None."""
        return self.hop_link.get(target)

    @property
    def nics(self) -> tuple[str, ...]:
        """Return the job's NICs in rank order."""
        return tuple(sorted(self.rank_of_nic, key=lambda n: (self.rank_of_nic[n], n)))

    @property
    def leaves(self) -> tuple[str, ...]:
        """Return the leaves the job's NICs hang off."""
        return tuple(self.leaf_nics)

    def hosts(self) -> tuple[str, ...]:
        """Return the job's hosts."""
        return tuple(sorted({self.nic_host[n] for n in self.rank_of_nic}))

    def gpus(self) -> tuple[str, ...]:
        """Return the job's GPUs."""
        return tuple(sorted({self.nic_gpu[n] for n in self.rank_of_nic}))

    def neighbours(self, leaf: str) -> tuple[str, ...]:
        """Return the NICs under ``leaf`` that are not the job's."""
        return tuple(n for n in self.leaf_nics.get(leaf, ()) if n not in self.rank_of_nic)

    def to_dict(self) -> dict[str, object]:
        """Return the graph as JSON-ready values (nodes with their layer, edges)."""
        return {
            "job": self.job,
            "nodes": [{"id": n, "layer": lay} for n, lay in self.layer.items()],
            "edges": [[a, b] for a, bs in self.edges.items() for b in bs],
        }


def build_graph(fabric: Fabric, job: Job) -> CrossLayerGraph:
    """Return the cross-layer graph of ``job`` on ``fabric``; raise `FabricError` if the job
    names a NIC the fabric does not have."""
    layer: dict[str, str] = {job.id: "job"}
    edges: dict[str, list[str]] = {job.id: []}
    rank_of: dict[str, int] = {}
    nic_host, nic_gpu, nic_link, nic_leaf = {}, {}, {}, {}

    def edge(a: str, b: str, lay: str) -> None:
        layer.setdefault(b, lay)
        edges.setdefault(a, [])
        if b not in edges[a]:
            edges[a].append(b)

    for k, rank in enumerate(job.ranks):
        rid = f"{job.id}/rank{k}"
        edge(job.id, rid, "rank")
        for nic_id in rank:
            if nic_id not in fabric.nic_index:
                raise FabricError(f"job {job.id}: NIC {nic_id!r} is not in the fabric")
            nic = fabric.nic(nic_id)
            rank_of.setdefault(nic_id, k)
            gpu = gpu_id(nic.host, nic.port)
            link = fabric.links[int(fabric.nic_link[nic.index])].id
            nic_host[nic_id], nic_gpu[nic_id], nic_link[nic_id] = nic.host, gpu, link
            nic_leaf[nic_id] = nic.leaf
            edge(rid, nic.host, "host")
            edge(rid, gpu, "gpu")
            edge(gpu, nic_id, "nic")
            edge(nic_id, link, "link")
            edge(link, nic.leaf, "switch")
    leaf_nics: dict[str, tuple[str, ...]] = {}
    uplinks: dict[str, tuple[str, ...]] = {}
    for leaf in sorted(set(nic_leaf.values())):
        under = [n for n in fabric.nics if n.leaf == leaf]
        leaf_nics[leaf] = tuple(n.id for n in under)
        for n in under:  # the neighbours too: where a pause storm may come from
            nic_host.setdefault(n.id, n.host)
            nic_gpu.setdefault(n.id, gpu_id(n.host, n.port))
            nic_link.setdefault(n.id, fabric.links[int(fabric.nic_link[n.index])].id)
            nic_leaf.setdefault(n.id, leaf)
        ups = tuple(lk.id for lk in fabric.links if lk.lower == leaf)
        uplinks[leaf] = ups
        for up in ups:
            edge(leaf, up, "link")
            edge(up, fabric.link(up).upper, "switch")
    hop_link: dict[str, str] = {}
    for link_id in {*nic_link.values(), *(u for ups in uplinks.values() for u in ups)}:
        lk = fabric.link(link_id)
        for name in (lk.id, f"{lk.lower}->{lk.upper}", f"{lk.upper}->{lk.lower}"):
            hop_link[name] = lk.id
    return CrossLayerGraph(
        job=job.id,
        layer=layer,
        edges={a: tuple(bs) for a, bs in edges.items()},
        rank_of_nic=rank_of,
        nic_host=nic_host,
        nic_gpu=nic_gpu,
        nic_link=nic_link,
        nic_leaf=nic_leaf,
        leaf_nics=leaf_nics,
        uplinks=uplinks,
        hop_link=hop_link,
    )
