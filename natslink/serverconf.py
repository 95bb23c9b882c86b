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
    """One server of a cluster: its ``name``, ``host`` (the address its peers route to),
    client ``port``, ``cluster_port`` for routes, JetStream ``store_dir``, optional
    ``monitor_port`` (0: none) and ``listen`` (the address it binds; default ``host``)."""

    name: str
    host: str
    port: int
    cluster_port: int
    store_dir: str
    monitor_port: int = 0
    listen: str = ""


MAX_PAYLOAD = "8MB"
"""The largest message the servers take; 8 MB is the most nats-server's docs advise (it warns
above it; 64 MB is its hard limit; its default is 1 MB). Larger KV values (the clock models,
7.7 MB at 100,000 NICs; a learned fabric's version, 3.9 MB without paths) travel as chunks
under it (`natslink.bigkv`), so fewer, larger chunks, not whether they fit, is what it sets."""


def server_conf(
    me: ServerSpec,
    peers: Sequence[ServerSpec],
    *,
    subjects: Subjects,
    partitions: int,
    cluster: str = "qpmesh",
    max_file: str = "8G",
    max_mem: str = "256M",
    max_payload: str = MAX_PAYLOAD,
) -> str:
    """Return the configuration file of server ``me`` in a cluster with ``peers`` (the other
    servers; none: a single server without routes), messages up to ``max_payload``
    (`MAX_PAYLOAD`). Raises `SubjectError` like `mapping`."""
    bind = me.listen or me.host
    lines = [
        f"server_name: {me.name}",
        f"listen: {bind}:{me.port}",
        f"max_payload: {max_payload}",
    ]
    if me.monitor_port:
        lines.append(f"http: {bind}:{me.monitor_port}")
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
            f"  listen: {bind}:{me.cluster_port}",
            f"  routes: [{routes}]",
            "}",
        ]
    return "\n".join(lines) + "\n" + mapping(subjects, partitions)


def packaged(partitions: int = 8) -> dict[str, str]:
    """Return the files of ``packaging/nats/``: ``nats-server-N.conf`` for the three servers
    ``nats-1``, ``nats-2``, ``nats-3`` (Debian's ``/etc/nats-server.conf``: clients on 4222,
    routes on 6222, monitoring on 8222, JetStream in ``/var/lib/nats/jetstream``, up to 64 GiB
    of it: the probe stream's ``[fleet] max_bytes`` must fit)."""
    specs = [ServerSpec(f"nats-{i}", f"nats-{i}", 4222, 6222, "/var/lib/nats/jetstream", 8222,
                        "0.0.0.0") for i in (1, 2, 3)]  # fmt: skip
    head = ("# qpmesh's data plane (docs/scale.md): one of three servers; written by\n"
            "# natslink.serverconf.packaged (tests/test_natslink_packaging.py keeps it equal).\n"
            "# partition(8,1) must equal [fleet] partitions in the controllers' config.\n")  # fmt: skip
    return {f"nats-server-{i + 1}.conf": head + server_conf(s, specs, subjects=Subjects(),
                                                            partitions=partitions, max_file="64G")
            for i, s in enumerate(specs)}  # fmt: skip


__all__ = ["ServerSpec", "SubjectError", "mapping", "packaged", "server_conf"]
