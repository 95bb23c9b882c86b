"""The ``[api]`` table of the controller's config (pure apart from reading the files it names).

::

    [api]
    listen = "127.0.0.1:8080"        # HOST:PORT; no [api] table or no listen = no API
    token_file = "tokens.txt"        # lines "operator NAME TOKEN" / "tenant NAME TOKEN"
    operator_token = "..."           # and/or one operator token inline (>= 8 characters)
    rate_per_s = 50.0                # token bucket per token
    burst = 100
    ws_min_interval_s = 0.25         # websocket snapshots at most this often
    tls_cert = "api.crt"             # HTTPS: certificate chain and key (PEM), both or neither
    tls_key = "api.key"
    tls_client_ca = "clients-ca.crt" # with TLS: every client shows a certificate of this CA
    cors_origins = ["https://grafana.example.org"]   # browser pages that may call the API
    ticket_ttl_s = 30                # websocket tickets live this long (0 < s <= 300)

    [api.tenants]                    # what each tenant may see and run jobs on
    acme = ["host0", "nic9"]         # NIC and host ids of the fabric (a host: all its NICs)

File names are relative to the config file's folder. `read_api_table` returns an `ApiConfig`
or None (no API); the TLS files are read once at load, so a missing file, a key that does not
match its certificate or a bad CA is an error at start, not at the first connection.
`read_tenants` returns ``[api.tenants]`` as written (tenant -> ids); the controller's config
checks it against the fabric (`controller.tenancy.Grants.build`): the grants bind the jobs
that arrive over MQTT too, so they hold with or without an API. Errors are the table's error
class (one line naming the file and key).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

from contract.tomlcheck import Table
from controller.api.access import AccessError, TlsFiles, WebAccess
from controller.api.app import ApiOptions
from controller.api.auth import Principal, TokenError, TokenTable, parse_token_file
from controller.api.server import parse_listen

TENANTS = "tenants"
"""The sub-table of ``[api]`` that grants NICs to tenants."""


@dataclass(frozen=True)
class ApiConfig:
    """Where to serve, with which tokens and limits, and how it is reached (TLS, browsers,
    websocket tickets: ``access``)."""

    host: str
    port: int
    tokens: TokenTable
    options: ApiOptions
    access: WebAccess = field(default_factory=WebAccess)


def read_tenants(tab: Table) -> dict[str, tuple[str, ...]]:
    """Return ``[api.tenants]`` of ``tab`` (the ``[api]`` table): tenant -> the NIC and host
    ids granted, as written (empty when unset). Raises the table's error unless every value
    is a list of strings; names and ids are checked by `controller.tenancy.Grants.build`."""
    out: dict[str, tuple[str, ...]] = {}
    for tenant, ids in tab.mapping(TENANTS, list, "a list of NIC and host ids").items():
        for i, ident in enumerate(ids):
            if not isinstance(ident, str):
                raise tab.err(
                    f"{TENANTS}.{tenant}[{i}]", f"must be a NIC or host id, got {ident!r}"
                )
        out[tenant] = tuple(ids)
    return out


def read_api_table(tab: Table, base_dir: Path | None) -> ApiConfig | None:
    """Return the API config of ``tab`` (the ``[api]`` table), None if it sets nothing but
    ``[api.tenants]``. Raises the table's error on bad values, an unreadable or bad token
    file, no token, or TLS files that cannot be read or do not make a TLS context. Call
    `read_tenants` on the same table first (this reads every other key)."""
    if not set(tab.values) - {TENANTS}:
        return None
    listen = tab.require("listen", str)
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise tab.err("listen", str(exc)) from None
    tokens = _tokens(tab, base_dir)
    pos = "a number > 0"
    d = ApiOptions()
    try:
        options = ApiOptions(
            rate_per_s=tab.get("rate_per_s", float, d.rate_per_s, lambda v: v > 0, pos),
            burst=tab.get("burst", float, d.burst, lambda v: v >= 1, "a number >= 1"),
            ws_min_interval_s=tab.get(
                "ws_min_interval_s", float, d.ws_min_interval_s, lambda v: v > 0, pos
            ),
        )
    except ValueError as exc:
        if isinstance(exc, tab.error):
            raise
        raise tab.err("rate_per_s", str(exc)) from None
    access = read_access(tab, base_dir)
    tab.finish()
    return ApiConfig(host, port, tokens, options, access)


def _tokens(tab: Table, base_dir: Path | None) -> TokenTable:
    """Return the tokens of ``token_file`` and ``operator_token`` (at least one)."""
    tokens = TokenTable({})
    if tab.has("token_file"):
        path = _path(tab, "token_file", base_dir)
        try:
            tokens = parse_token_file(path)
        except OSError as exc:
            raise tab.err("token_file", f"cannot read {path}: {exc.strerror}") from None
        except TokenError as exc:
            raise tab.err("token_file", str(exc)) from None
    if tab.has("operator_token"):
        tok = tab.require("operator_token", str)
        try:
            tokens = tokens.merged(TokenTable({tok: Principal("operator", "config")}))
        except TokenError as exc:
            raise tab.err("operator_token", str(exc)) from None
    if not len(tokens):
        raise tab.err("listen", "the API needs token_file or operator_token")
    return tokens


def read_access(tab: Table, base_dir: Path | None) -> WebAccess:
    """Return the `WebAccess` of ``tls_cert``, ``tls_key``, ``tls_client_ca``,
    ``cors_origins`` and ``ticket_ttl_s`` (defaults: plain HTTP, no browser origin, 30 s
    tickets). The TLS files are loaded once here to check them. Raises the table's error."""
    d = WebAccess()
    origins = tab.get("cors_origins", list, [])
    for i, o in enumerate(origins):
        if not isinstance(o, str):
            raise tab.err(f"cors_origins[{i}]", f"must be an origin like https://host, got {o!r}")
    ttl = tab.get("ticket_ttl_s", float, d.ticket_ttl_s, lambda v: 0 < v <= 300,
                  "a number of s in (0, 300]")  # fmt: skip
    tls = _tls(tab, base_dir)
    try:
        return WebAccess(tls=tls, cors_origins=frozenset(origins), ticket_ttl_s=ttl)
    except AccessError as exc:
        raise tab.err("cors_origins", str(exc)) from None


def _tls(tab: Table, base_dir: Path | None) -> TlsFiles | None:
    """Return the TLS files (None: plain HTTP), checked by building their context."""
    cert = _path(tab, "tls_cert", base_dir) if tab.has("tls_cert") else None
    key = _path(tab, "tls_key", base_dir) if tab.has("tls_key") else None
    ca = _path(tab, "tls_client_ca", base_dir) if tab.has("tls_client_ca") else None
    if cert is None and key is None:
        if ca is not None:
            raise tab.err("tls_client_ca", "needs tls_cert and tls_key (client certificates "
                          "are asked for over TLS only)")  # fmt: skip
        return None
    if cert is None or key is None:
        raise tab.err("tls_key" if key is None else "tls_cert", "tls_cert and tls_key go together")
    for name, path in (("tls_cert", cert), ("tls_key", key), ("tls_client_ca", ca)):
        if path is not None and not path.is_file():
            raise tab.err(name, f"cannot read {path}: no such file")
    # load them once, the server's way: the certificate with its key, then the CA
    _load(tab, "tls_cert", TlsFiles(cert, key), f"{cert} with {key}")
    if ca is not None:
        _load(tab, "tls_client_ca", TlsFiles(cert, key, ca), str(ca))
    return TlsFiles(cert, key, ca)


def _load(tab: Table, key: str, files: TlsFiles, what: str) -> None:
    """Build the TLS context of ``files``; raise the table's error for ``key`` if it fails."""
    try:
        files.context()
    except ssl.SSLError as exc:  # an OSError too: caught first
        raise tab.err(key, f"{what}: not usable for TLS: {exc.reason or exc}") from None
    except OSError as exc:
        raise tab.err(key, f"cannot read {what}: {exc.strerror or exc}") from None


def _path(tab: Table, key: str, base_dir: Path | None) -> Path:
    """Return the file name ``key`` (a non-empty string), relative to ``base_dir``."""
    path = Path(tab.require(key, str, bool, "a file name"))
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return path
