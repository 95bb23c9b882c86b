"""Host telemetry: the health the prober publishes on its health topic, and the hardware
signals of the catalogue (`contract.signals`) for the signals topic.

Health:

- `prober.telemetry.gpu`: NVML GPU health (temperature, power, ECC/retired pages, PCIe replays,
  NVLink errors, XIDs); "no GPU" is a clean, reportable state.
- `prober.telemetry.nic`: NIC link state and error counters from ``/sys/class/net/<dev>/``.

Signals (docs/crosslayer.md):

- `netdev` (``/proc/net/dev`` of the thread's namespace), `qdisc` (root qdiscs, rtnetlink),
  `ethtool` (counters by name, link, MTU), `rdma` (port and hw counters), `pcie` (AER),
  `gpuperf` (NVML performance), `host` (procfs): a pure mapping to catalogue names and a thin
  reader each;
- `rates`: counters to per-second rates (wraps, saturation, resets);
- `collector`: one host's `Reading` and the `window` document between two;
- `signals_cli`: ``qpmesh prober signals [--bench]``.

Each module has a thin reader (I/O) and a pure mapping from raw values to a record.
"""
