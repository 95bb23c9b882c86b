"""The NATS link: JetStream for qpmesh's data plane (probe batches, partials, leases, clocks).

- `natslink.settings`: `NatsSettings` (servers, timeouts, backoff, TLS and credentials: the
  same `mqttlink.settings.MqttSecurity` keys as ``[mqtt]``), read from a config's ``[nats]``
  table through `contract.tomlcheck`;
- `natslink.errors`: the boundary's one exception family (`NatsLinkError`) and `translate`;
- `natslink.link`: `connect` (an async context manager: one connection, nats-py's own
  reconnection off, so the services reconnect through `mqttlink.reconnect`'s one loop and
  `Backoff`) and `Link` (publish with a message id, pull consumers, KV buckets);
- `natslink.streams`: stream, consumer and KV bucket specs and their idempotent setup;
- `natslink.kvchunks` (pure) and `natslink.bigkv`: KV values past the server's
  ``max_payload`` as chunks and a manifest written last (`ChunkedKV`);
- `natslink.lease`: leases on a KV bucket (one owner per key, TTL and renewal; `LeaseClock`,
  the pure part, says when a lease must be renewed and when it is no longer safe to use);
- `natslink.subjects` and `natslink.serverconf`: subjects, the host -> partition hash, and
  the servers' configuration text (pure).

Imports `contract`, `mqttlink` (its `reconnect` loop and TLS settings) and nats-py.
"""
