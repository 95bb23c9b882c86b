"""The controller's HTTP API and websocket (``/api/v1/``), served with aiohttp.

`controller.api.views` (pure: snapshot values in, JSON-ready dicts out), `controller.api.auth`
(bearer tokens, tenant scopes, the token bucket), `controller.api.hub` (the latest snapshot and
the event log a producer publishes into, websocket fan-out), `controller.api.app` (the aiohttp
app factory and its thin handlers) and `controller.api.server` (serving it from a thread or the
running loop). The routes are described in ``docs/openapi.yaml``.
"""
