"""The ``[api]`` table of the controller's config (pure apart from reading the token file).

::

    [api]
    listen = "127.0.0.1:8080"        # HOST:PORT; no [api] table or no listen = no API
    token_file = "tokens.txt"        # lines "operator NAME TOKEN" / "tenant NAME TOKEN"
    operator_token = "..."           # and/or one operator token inline (>= 8 characters)
    rate_per_s = 50.0                # token bucket per token
    burst = 100
    ws_min_interval_s = 0.25         # websocket snapshots at most this often

`read_api_table` returns an `ApiConfig` or None (no API); errors are the table's error class
(one line naming the file and key).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from contract.tomlcheck import Table
from controller.api.app import ApiOptions
from controller.api.auth import Principal, TokenError, TokenTable, parse_token_file
from controller.api.server import parse_listen


@dataclass(frozen=True)
class ApiConfig:
    """Where to serve, with which tokens and limits."""

    host: str
    port: int
    tokens: TokenTable
    options: ApiOptions


def read_api_table(tab: Table, base_dir: Path | None) -> ApiConfig | None:
    """Return the API config of ``tab`` (the ``[api]`` table), None if it sets no ``listen``.
    Raises the table's error on bad values, an unreadable or bad token file, or no token."""
    if not tab.values:
        return None
    listen = tab.require("listen", str)
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise tab.err("listen", str(exc)) from None
    tokens = TokenTable({})
    if tab.has("token_file"):
        path = Path(tab.require("token_file", str))
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
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
    tab.finish()
    return ApiConfig(host, port, tokens, options)
