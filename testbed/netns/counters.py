"""Interface packet counters inside a namespace (to see which spine a flow took)."""

from __future__ import annotations

import json

from testbed.netns.apply import run


def rx_packets(ns: str) -> dict[str, int]:
    """Return received packets per interface of namespace ``ns``; raise `TestbedEnvError`."""
    doc = json.loads(run(["ip", "-n", ns, "-s", "-j", "link", "show"]) or "[]")
    return {d["ifname"]: int(d.get("stats64", {}).get("rx", {}).get("packets", 0)) for d in doc}
