"""Interface packet counters inside a namespace (to see which spine a flow took)."""

from __future__ import annotations

import json

from testbed.netns.apply import run


def rx_packets(ns: str) -> dict[str, int]:
    """Return received packets per interface of namespace ``ns``; raise `TestbedEnvError`."""
    doc = json.loads(run(["ip", "-n", ns, "-s", "-j", "link", "show"]) or "[]")
    return {d["ifname"]: int(d.get("stats64", {}).get("rx", {}).get("packets", 0)) for d in doc}


def qdisc_backlog_bytes(ns: str, ifname: str) -> int:
    """Return the bytes queued in the root qdisc of ``ifname`` in namespace ``ns`` (0 if the
    device has no qdisc statistics); raise `TestbedEnvError` if ``tc`` fails."""
    doc = json.loads(run(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", ifname]) or "[]")
    return sum(int(d.get("backlog", 0)) for d in doc if d.get("root"))
