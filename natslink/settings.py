"""Where and how to reach the NATS servers: `NatsSettings`, read from a ``[nats]`` table.

The timeout, backoff, drain and the TLS and credential keys are those of ``[mqtt]``
(`contract.connection.ClientLink` with its `MqttSecurity`, read by `contract.connection.read_link`:
``tls``, ``ca_file``, ``cert_file``, ``key_file``, ``username``, ``password_file``): one
shape for a broker client's connection, whichever broker.
`connect_kwargs` turns them into nats-py's arguments (an `ssl.SSLContext`, user and password);
the password is read from its file at each connect and never kept.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from contract.connection import ClientLink, MqttSecurity, read_link, read_password
from contract.tomlcheck import Table
from natslink.subjects import DEFAULT_SUBJECT_PREFIX, Subjects

SCHEMES = ("nats", "tls")


def check_server(url: str) -> str:
    """Return ``url`` if it is ``nats://HOST:PORT`` or ``tls://HOST:PORT``; raise ValueError."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in SCHEMES or not parts.hostname or port is None:
        raise ValueError(f"server must look like nats://HOST:PORT, got {url!r}")
    if parts.username or parts.password:
        raise ValueError(f"server {url!r}: credentials belong in username/password_file")
    return url


@dataclass(frozen=True, slots=True)
class NatsSettings(ClientLink):
    """How to reach the NATS servers; validated (ValueError).

    ``servers``: the cluster's client URLs (a connection tries them in order);
    ``subject_prefix``: the subjects' first levels (`natslink.subjects.Subjects`);
    ``connect_timeout_s``: one connect attempt. ``timeout_s`` (every request: publish ack,
    fetch, KV operation), the backoff bounds, ``drain_on_stop_s`` and ``security`` are
    `contract.connection.ClientLink`'s (keyword-only).
    """

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    subject_prefix: str = DEFAULT_SUBJECT_PREFIX
    connect_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.servers:
            raise ValueError("servers must name at least one server")
        for url in self.servers:
            check_server(url)
        Subjects(self.subject_prefix)  # raises SubjectError (a ValueError)
        if self.connect_timeout_s <= 0:
            raise ValueError("connect_timeout_s must be positive")
        self.check_link()

    @property
    def subjects(self) -> Subjects:
        """Return the subjects under ``subject_prefix``."""
        return Subjects(self.subject_prefix)

    def describe(self) -> dict[str, Any]:
        """Return what may be shown (logs, ``--dry-run``): no secret."""
        return {"servers": list(self.servers), "subject_prefix": self.subject_prefix,
                **self.security.describe()}  # fmt: skip


def connect_kwargs(security: MqttSecurity) -> dict[str, Any]:
    """Return nats-py's connect arguments for ``security`` (``tls``: an `ssl.SSLContext`
    verifying the servers against ``ca_file`` or the system CAs, with the client certificate
    if set; ``user``/``password``). Raises `CredentialError` if a file cannot be read. The
    result holds the password: pass it to the client, never log it."""
    out: dict[str, Any] = {}
    if security.tls:
        ctx = ssl.create_default_context(cafile=security.ca_file or None)
        if security.cert_file:
            ctx.load_cert_chain(security.cert_file, security.key_file)
        out["tls"] = ctx
    if security.username:
        out["user"] = security.username
        if security.password_file:
            out["password"] = read_password(security.password_file)
    return out


def read_nats(tab: Table, base_dir: Path | None) -> NatsSettings | None:
    """Return the settings of a ``[nats]`` table (None when the config has none): ``servers``
    (a list of ``nats://HOST:PORT``), ``subject_prefix``, ``connect_timeout_s``,
    ``drain_on_stop_s`` and the keys every broker's table has (`contract.connection.read_link`:
    ``timeout_s``, ``backoff_min_s``, ``backoff_max_s``, TLS and credentials; files relative
    to ``base_dir``). Raises the table's error
    (one line naming the file and key); leaves other keys to the caller (call
    ``tab.finish()`` after reading them)."""
    if not tab.values:
        return None

    def urls_ok(v: list[Any]) -> bool:
        return bool(v) and all(isinstance(u, str) for u in v)

    servers = tab.require("servers", list, urls_ok, "a list of nats://HOST:PORT strings")
    kw: dict[str, Any] = {
        "servers": tuple(servers),
        "subject_prefix": tab.get("subject_prefix", str, DEFAULT_SUBJECT_PREFIX),
        "connect_timeout_s": tab.get(
            "connect_timeout_s", float, 2.0, lambda v: 0 < v <= 600, "in (0, 600]"
        ),
        **read_link(tab, base_dir),
        "drain_on_stop_s": tab.get(
            "drain_on_stop_s", float, 5.0, lambda v: 0 <= v <= 600, "in [0, 600]"
        ),
    }
    try:
        return NatsSettings(**kw)
    except ValueError as exc:
        raise tab.error(f"{tab.source}: {tab.path or 'nats'}: {exc}") from None
