"""Time series: the controller's measurements as InfluxDB line protocol, written to an
InfluxDB v2 write API (InfluxDB, VictoriaMetrics) from a bounded buffer; and the
controller's own Prometheus metrics.

Pure: `lineproto` (points), `stats` (per-interval percentiles and loss), `points` (the
schema), the buffer of `writer` (its retries wait `mqttlink.reconnect.Backoff`). Thin shell: `TsdbWriter` (a thread around
influxdb-client), `metrics.serve_metrics`. `recorder` joins them to the live controller.
See docs/timeseries.md.
"""
