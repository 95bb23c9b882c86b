"""Host telemetry the prober publishes on its health topic.

- `prober.telemetry.gpu`: NVML GPU health (temperature, power, ECC/retired pages, PCIe replays,
  NVLink errors, XIDs); "no GPU" is a clean, reportable state.
- `prober.telemetry.nic`: NIC link state and error counters from ``/sys/class/net/<dev>/``.

Each module has a thin reader (I/O) and a pure mapping from raw values to a health record.
"""
