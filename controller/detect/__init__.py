"""Detectors: per-window loss and delay evidence, and cause separation.

- `controller.detect.loss`: per-link probe / loss accumulation over a window (`LossWindow`);
- `controller.detect.delay`: per-path propagation baselines (`PathBaselines`) and per-hop queueing
  delay accumulation (`DelayWindow`);
- `controller.detect.causes`: which NICs are excluded (host prober down/silent) and how a blamed
  link becomes a NIC, link or host finding.

All pure: arrays and ``now_ns`` in, arrays out. Localization itself is `controller.localize`.
"""
