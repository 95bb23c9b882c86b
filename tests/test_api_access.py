"""How the API is reached: TLS (and client certificates), browsers (CORS, OPTIONS) and the
websocket ticket that keeps long-lived tokens out of URLs (issue 33 item 3)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controller.api.access import AccessError, Tickets, TlsFiles, WebAccess
from controller.api.app import PREFIX, ApiOptions, make_app
from controller.api.auth import Principal, TokenTable
from controller.api.hub import ApiHub
from controller.api.server import ApiThread
from controller.live import LiveController
from controller.tenancy import Grants
from mesh.fabric import FabricShape, build_fabric
from tests.pki import make_pki

OP, ACME = "operator-token-1", "acme-tenant-token"
TOKENS = TokenTable({OP: Principal("operator", "ops"), ACME: Principal("tenant", "acme")})
FAB = build_fabric(FabricShape.for_nics(8, nics_per_leaf=4))
GRANTS = Grants.build({"acme": ["nic1"]}, FAB)
ORIGIN = "https://grafana.example.org"


def auth(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


@pytest.fixture
async def client() -> AsyncIterator[tuple[TestClient[web.Request, web.Application], list[float]]]:
    now = [0.0]
    access = WebAccess(cors_origins=frozenset({ORIGIN}), ticket_ttl_s=10.0)
    app = make_app(ApiHub(LiveController(FAB).snapshot()), TOKENS, grants=GRANTS, access=access,
                   options=ApiOptions(ws_min_interval_s=0.01), clock=lambda: now[0])  # fmt: skip
    async with TestClient(TestServer(app)) as c:
        yield c, now


async def test_options_answers_every_route_without_a_token_and_grants_only_allowed_origins(
    client: tuple[TestClient[Any, Any], list[float]],
) -> None:
    c, _ = client
    r = await c.options(PREFIX + "/jobs")
    assert r.status == 204 and r.headers["Allow"] == "GET, OPTIONS, POST"
    assert "Access-Control-Allow-Origin" not in r.headers
    pre = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}  # fmt: skip
    r = await c.options(PREFIX + "/jobs", headers=pre)
    assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in r.headers["Access-Control-Allow-Methods"]
    assert "Authorization" in r.headers["Access-Control-Allow-Headers"]
    r = await c.options(PREFIX + "/jobs", headers={**pre, "Origin": "https://evil.example"})
    assert r.status == 204 and "Access-Control-Allow-Origin" not in r.headers
    r = await c.options(PREFIX + "/jobs", headers={**pre, "Access-Control-Request-Method": "PUT"})
    assert "Access-Control-Allow-Origin" not in r.headers  # a method the route has not
    r = await c.options(PREFIX + "/nics/nic1", headers=pre)
    assert r.headers["Allow"] == "GET, OPTIONS"
    r = await c.options(PREFIX + "/nope")
    assert r.status == 404 and (await r.json())["error"]["status"] == 404


async def test_answers_carry_cors_headers_for_allowed_origins_errors_too(
    client: tuple[TestClient[Any, Any], list[float]],
) -> None:
    c, _ = client
    r = await c.get(PREFIX + "/version", headers={**auth(OP), "Origin": ORIGIN})
    assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "Origin" in r.headers["Vary"]
    r = await c.get(PREFIX + "/version", headers={"Origin": ORIGIN})  # no token
    assert r.status == 401 and r.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "WWW-Authenticate" in r.headers["Access-Control-Expose-Headers"]
    r = await c.get(PREFIX + "/version", headers={**auth(OP), "Origin": "https://evil.example"})
    assert r.status == 200 and "Access-Control-Allow-Origin" not in r.headers


async def test_a_websocket_ticket_is_short_lived_single_use_and_scoped(
    client: tuple[TestClient[Any, Any], list[float]],
) -> None:
    c, now = client
    r = await c.post(PREFIX + "/tickets", headers=auth(ACME))
    doc = await r.json()
    assert r.status == 201 and doc["expires_in_s"] == 10.0 and len(doc["ticket"]) >= 32
    ws = await c.ws_connect(f"{PREFIX}/ws?ticket={doc['ticket']}", headers={"Origin": ORIGIN})
    first = await ws.receive_json(timeout=30)
    assert first["data"]["scope"] == "tenant" and [n["id"] for n in first["data"]["nics"]] == [
        "nic1"
    ]
    await ws.close()
    r = await c.get(f"{PREFIX}/ws?ticket={doc['ticket']}")  # used: gone
    assert r.status == 401
    late = (await (await c.post(PREFIX + "/tickets", headers=auth(OP))).json())["ticket"]
    now[0] += 10.5
    assert (await c.get(f"{PREFIX}/ws?ticket={late}")).status == 401  # expired
    other = (await (await c.post(PREFIX + "/tickets", headers=auth(OP))).json())["ticket"]
    assert (await c.get(f"{PREFIX}/snapshot?ticket={other}")).status == 401  # websocket only
    r = await c.post(PREFIX + "/tickets", headers=auth(OP), data=b"{}")
    assert r.status == 400  # no body


async def test_a_page_from_a_foreign_origin_cannot_open_the_websocket(
    client: tuple[TestClient[Any, Any], list[float]],
) -> None:
    c, _ = client
    t = (await (await c.post(PREFIX + "/tickets", headers=auth(OP))).json())["ticket"]
    with pytest.raises(aiohttp.WSServerHandshakeError) as err:
        await c.ws_connect(f"{PREFIX}/ws?ticket={t}", headers={"Origin": "https://evil.example"})
    assert err.value.status == 403
    ws = await c.ws_connect(PREFIX + "/ws", headers=auth(OP))  # no Origin: not a browser
    assert (await ws.receive_json(timeout=30))["type"] == "snapshot"
    await ws.close()


def test_tickets_pure() -> None:
    t = Tickets(5.0)
    who = Principal("tenant", "acme")
    a = t.issue(who, ACME, 0.0)
    b = t.issue(who, ACME, 1.0)
    assert a != b and len(t) == 2
    assert t.redeem("nope", 1.0) is None
    got = t.redeem(a, 4.9)
    assert got is not None and got.who == who and got.token == ACME
    assert t.redeem(a, 4.9) is None  # single use
    assert t.redeem(b, 6.0) is None and len(t) == 0  # dead after its lifetime


@pytest.mark.parametrize(
    "kw",
    [
        {"cors_origins": frozenset({"grafana.example.org"})},
        {"ticket_ttl_s": 0.0},
        {"ticket_ttl_s": 3600.0},
        {"cors_max_age_s": -1},
    ],
)
def test_bad_access_settings_are_one_line_errors(kw: dict[str, Any]) -> None:
    with pytest.raises(AccessError):
        WebAccess(**kw)


# ---- TLS -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _serve(tls: TlsFiles) -> ApiThread:
    app = make_app(ApiHub(LiveController(FAB).snapshot()), TOKENS, grants=GRANTS,
                   access=WebAccess(tls=tls))  # fmt: skip
    srv = ApiThread(app, "127.0.0.1", 0, tls.context())
    srv.start()
    return srv


def _client_ctx(pki: dict[str, tuple[Path, Path]], who: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["ca"][0]))
    if who is not None:
        ctx.load_cert_chain(*pki[who])
    return ctx


async def _get(url: str, ctx: ssl.SSLContext | bool) -> int:
    async with aiohttp.ClientSession() as http, http.get(url, headers=auth(OP), ssl=ctx) as r:
        return r.status


async def test_the_api_serves_https_and_nothing_in_clear(pki: dict[str, tuple[Path, Path]]) -> None:
    srv = _serve(TlsFiles(*pki["server"]))
    try:
        url = f"https://127.0.0.1:{srv.port}{PREFIX}/version"
        assert await _get(url, _client_ctx(pki, None)) == 200
        with pytest.raises(aiohttp.ClientError):  # plain HTTP on the TLS port
            await _get(url.replace("https:", "http:"), False)
        with pytest.raises(aiohttp.ClientConnectorCertificateError):  # a client trusting
            await _get(url, ssl.create_default_context())  # another CA refuses the server
    finally:
        srv.stop()


async def test_client_certificates_are_required_when_a_client_ca_is_set(
    pki: dict[str, tuple[Path, Path]],
) -> None:
    srv = _serve(TlsFiles(*pki["server"], client_ca=pki["ca"][0]))
    try:
        url = f"https://127.0.0.1:{srv.port}{PREFIX}/version"
        assert await _get(url, _client_ctx(pki, "client")) == 200
        for who in (None, "rogue"):
            with pytest.raises(aiohttp.ClientError):
                await _get(url, _client_ctx(pki, who))
    finally:
        srv.stop()


def test_bad_tls_files_fail_at_start(pki: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    with pytest.raises(OSError):
        TlsFiles(tmp_path / "missing.crt", tmp_path / "missing.key").context()
    with pytest.raises(ssl.SSLError):
        TlsFiles(pki["server"][0], pki["client"][1]).context()  # a key of another certificate


def test_the_tui_reads_an_https_api_with_its_ca_and_a_client_certificate(
    pki: dict[str, tuple[Path, Path]],
) -> None:
    from tui.apiclient import ApiSource
    from tui.cli import TuiError, client_tls

    srv = _serve(TlsFiles(*pki["server"], client_ca=pki["ca"][0]))
    try:
        tls = client_tls(str(pki["ca"][0]), *map(str, pki["client"]))
        src = ApiSource(f"https://127.0.0.1:{srv.port}", OP, ssl_context=tls)
        src.start()
        try:
            assert len(src.snapshot().fabric.nics) == 8 and src.base.startswith("https://")
        finally:
            src.close()
    finally:
        srv.stop()
    with pytest.raises(TuiError, match="go together"):
        client_tls(None, str(pki["client"][0]), None)
    with pytest.raises(TuiError, match="cannot read"):
        client_tls("/nonexistent/ca.crt", None, None)


def _conf(d: Path, pki: dict[str, tuple[Path, Path]], api: str) -> Path:
    """Write the PKI next to a config whose ``[api]`` table is ``api``; return the config."""
    for name in ("ca", "server", "client"):
        for src in pki[name]:
            (d / src.name).write_bytes(src.read_bytes())
    conf = d / "c.toml"
    conf.write_text('[fabric]\nleaves = 2\nhosts_per_leaf = 4\n[api]\nlisten = "127.0.0.1:0"\n'
                    f'operator_token = "{OP}"\n{api}\n')  # fmt: skip
    return conf


def test_the_api_table_feeds_tls_cors_tickets_and_tenants_at_load(
    pki: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    from controller.config import ConfigError, load_config

    conf = _conf(tmp_path, pki, 'tls_cert = "server.crt"\ntls_key = "server.key"\n'
                 'tls_client_ca = "ca.crt"\ncors_origins = ["https://grafana.example.org"]\n'
                 'ticket_ttl_s = 5\n[api.tenants]\nacme = ["host0", "nic5"]\nbeta = ["host2"]')  # fmt: skip
    cfg = load_config(conf)
    assert cfg.api is not None
    access = cfg.api.access
    assert access.tls == TlsFiles(tmp_path / "server.crt", tmp_path / "server.key",
                                  tmp_path / "ca.crt")  # fmt: skip
    assert access.scheme == "https" and access.ticket_ttl_s == 5.0
    assert access.cors_origins == {"https://grafana.example.org"}
    assert cfg.grants.nics_of("acme") == {"nic0", "nic5"} and cfg.grants.owner("nic2") == "beta"
    # grants without an API still bind the jobs that arrive over MQTT
    conf.write_text('[fabric]\nleaves = 2\nhosts_per_leaf = 4\n[api.tenants]\nacme = ["nic1"]\n')
    cfg = load_config(conf)
    assert cfg.api is None and cfg.grants.nics_of("acme") == {"nic1"}
    assert load_config(None).grants.tenants() == frozenset()
    (tmp_path / "other.key").write_bytes(pki["client"][1].read_bytes())
    (tmp_path / "junk.crt").write_text("not a certificate\n")
    for api, msg in [
        ('tls_cert = "server.crt"', r"api\.tls_key: tls_cert and tls_key go together"),
        ('tls_client_ca = "ca.crt"', r"api\.tls_client_ca: needs tls_cert and tls_key"),
        ('tls_cert = "nope.crt"\ntls_key = "server.key"', r"api\.tls_cert: cannot read .*nope"),
        ('tls_cert = "server.crt"\ntls_key = "other.key"', r"api\.tls_cert: .*not usable"),
        ('tls_cert = "server.crt"\ntls_key = "server.key"\ntls_client_ca = "junk.crt"',
         r"api\.tls_client_ca: .*junk\.crt"),
        ('tls_cert = ""\ntls_key = "server.key"', r"api\.tls_cert: must be a file name"),
        ('cors_origins = ["grafana.example.org"]', r"api\.cors_origins: a CORS origin"),
        ("cors_origins = [1]", r"api\.cors_origins\[0\]"),
        ("cors_origins = 'https://a.example'", r"api\.cors_origins: must be a list"),
        ("ticket_ttl_s = 0", r"api\.ticket_ttl_s: must be a number of s in \(0, 300\]"),
        ("ticket_ttl_s = 301", r"api\.ticket_ttl_s"),
        ('[api.tenants]\nacme = ["nic99"]', r"api\.tenants: tenant acme: no NIC or host 'nic99'"),
        ('[api.tenants]\nacme = ["nic1"]\nbeta = ["host1"]', r"api\.tenants: .*already granted"),
        ('[api.tenants]\n"a:b" = ["nic1"]', r"api\.tenants: bad tenant name"),
        ('[api.tenants]\nacme = "nic1"', r"api\.tenants\.acme: must be a list"),
        ("[api.tenants]\nacme = [1]", r"api\.tenants\.acme\[0\]: must be a NIC or host id"),
    ]:  # fmt: skip
        _conf(tmp_path, pki, api)
        with pytest.raises(ConfigError, match=msg) as err:
            load_config(conf)
        assert "\n" not in str(err.value)


async def test_the_controllers_api_process_serves_https_from_its_config(
    pki: dict[str, tuple[Path, Path]],
) -> None:
    from controller.api.config import ApiConfig
    from controller.api.runtime import ApiRuntime

    tls = TlsFiles(*pki["server"], client_ca=pki["ca"][0])
    cfg = ApiConfig("127.0.0.1", 0, TOKENS, ApiOptions(), WebAccess(tls=tls))
    api = ApiRuntime(cfg, LiveController(FAB).snapshot())
    url = await api.start()
    try:
        assert url.startswith("https://127.0.0.1:")
        assert await _get(url + "version", _client_ctx(pki, "client")) == 200
        for who in (None, "rogue"):  # no client certificate, or one of another CA
            with pytest.raises(aiohttp.ClientError):
                await _get(url + "version", _client_ctx(pki, who))
        with pytest.raises(aiohttp.ClientError):  # nothing in clear
            await _get(url.replace("https:", "http:") + "version", False)
    finally:
        await api.stop()
