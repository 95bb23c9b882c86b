"""What exists of a testbed: namespaces, root links, recorded processes (alive or not)."""

from __future__ import annotations

from typing import Any

from testbed.netns.state import alive, load_state
from testbed.netns.teardown import list_namespaces, list_root_links


def testbed_status(prefix: str) -> dict[str, Any]:
    """Return a JSON-ready status of the testbed ``prefix`` (empty lists if it does not exist)."""
    state = load_state(prefix) or {}
    procs = [{**p, "alive": alive(p)} for p in state.get("processes", [])]
    return {
        "prefix": prefix,
        "state": bool(state),
        "complete": bool(state.get("complete", False)),
        "shape": state.get("shape"),
        "broker": state.get("broker_addr"),
        "namespaces": list_namespaces(prefix),
        "root_links": list_root_links(prefix),
        "processes": procs,
    }
