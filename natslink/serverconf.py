"""nats-server configuration text for qpmesh's data plane, as pure functions.

`mapping` is the one line every server of a cluster needs: the subject mapping that puts a
host's probe batches into its partition (``{{partition(n,1)}}``, nats-server 2.8+). `server_conf`
writes a whole server's file (client listener, JetStream store, cluster routes, the mapping):
the test fixture's clusters use it, and ``packaging/nats/`` holds the files it writes for
three servers (a test keeps them equal).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from natslink.subjects import SubjectError, Subjects


def mapping(subjects: Subjects, partitions: int) -> str:
    """Return the ``mappings`` block that partitions ``<prefix>.probes.<host>`` by host.

    Raises `SubjectError` unless 1 <= partitions <= 1024.
    """
    if not 1 <= partitions <= 1024:
        raise SubjectError(f"partitions must be in 1..1024, got {partitions}")
    src = f"{subjects.prefix}.probes.*"
    dst = f"{subjects.prefix}.probes.{{{{partition({partitions},1)}}}}.{{{{wildcard(1)}}}}"
    return f'mappings = {{\n  "{src}": "{dst}"\n}}\n'


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One server of a cluster: its ``name``, client ``host``:``port``, ``cluster_port`` for
    routes, JetStream ``store_dir``, optional ``monitor_port`` (0: none)."""

    name: str
    host: str
    port: int
    cluster_port: int
    store_dir: str
    monitor_port: int = 0


def server_conf(
    me: ServerSpec,
    peers: Sequence[ServerSpec],
    *,
    subjects: Subjects,
    partitions: int,
    cluster: str = "qpmesh",
    max_file: str = "8G",
    max_mem: str = "256M",
) -> str:
    """Return the configuration file of server ``me`` in a cluster with ``peers`` (the other
    servers; none: a single server without routes). Raises `SubjectError` like `mapping`."""
    lines = [
        f"server_name: {me.name}",
        f"listen: {me.host}:{me.port}",
    ]
    if me.monitor_port:
        lines.append(f"http: {me.host}:{me.monitor_port}")
    lines += [
        "jetstream {",
        f'  store_dir: "{me.store_dir}"',
        f"  max_memory_store: {max_mem}",
        f"  max_file_store: {max_file}",
        "}",
    ]
    others = [p for p in peers if p.name != me.name]
    if others:
        routes = ", ".join(f"nats-route://{p.host}:{p.cluster_port}" for p in others)
        lines += [
            "cluster {",
            f"  name: {cluster}",
            f"  listen: {me.host}:{me.cluster_port}",
            f"  routes: [{routes}]",
            "}",
        ]
    return "\n".join(lines) + "\n" + mapping(subjects, partitions)


__all__ = ["ServerSpec", "SubjectError", "mapping", "server_conf"]
