"""Unsupervised anomalies of hosts, NICs and GPUs from their hardware signals.

- `controller.anomaly.frame`: one window of one entity kind as a matrix (`SignalFrame`),
  from the hosts' `contract.signals.SignalsDoc` windows (`frame_from_docs`).
- `controller.anomaly.detector`: `AnomalyDetector` (own normal + peers, robust statistics)
  and its `Anomaly` findings, published as ``anomaly`` `contract.documents.EventDoc` events.
"""
