"""``qpmesh demo``: the embedded demo's command (the mesh grid on a live simulation).

The simulator-to-controller loop is `testbed.sim.demo_runner.DemoRunner`; the screen is
`tui.demo_app.DemoApp`, which drives it through the `tui.demo_app.DemoDriver` protocol.
``--headless`` runs in real time when it serves the API or writes time series; SIGTERM or
SIGINT end it early and it still prints its result (``"interrupted": true``, exit 130:
`contract.interrupt`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from contract.interrupt import interruptible
from testbed.demo_serve import DemoApi, new_token
from testbed.sim.demo_runner import (
    DEMO_SCENARIO,
    INJECT_KEYS,
    DemoError,
    DemoRunner,
    demo_scenario,
    demo_timeseries,
    run_headless,
)

__all__ = [
    "DEMO_SCENARIO",
    "INJECT_KEYS",
    "DemoError",
    "DemoRunner",
    "demo_scenario",
    "demo_timeseries",
    "run_demo",
    "run_headless",
]


def run_demo(args: argparse.Namespace) -> int:
    """``qpmesh demo``: the TUI on a live simulation, or ``--headless`` scenario playback."""
    sc = demo_scenario(args.scenario, nics=args.nics, seed=args.seed)
    url = getattr(args, "timeseries", None)
    listen = getattr(args, "serve", None)
    if args.headless:
        runner = DemoRunner(sc, step_s=args.step)
        # a signal ends the run between two steps; caught from before the API is announced,
        # so one sent as soon as it is (a test, an operator) cannot leave its thread running
        with interruptible(cooperative=True) as stop:
            api = _serve(runner, listen, getattr(args, "token", None))
            try:
                writer = demo_timeseries(runner, url)
                # real time when someone watches (the API) or the points are stamped on the
                # wall clock (the time series: played faster, they would lie in the future)
                realtime = api is not None or writer is not None
                result = run_headless(runner, args.duration or sc.duration_s,
                                      realtime=realtime, stop=stop.event)  # fmt: skip
            finally:
                if api is not None:
                    api.stop()
        if api is not None:
            result["api"] = {"url": api.url}
        if writer is not None:
            writer.close(30.0)
            st = writer.stats()
            result["timeseries"] = {
                "url": url, "written_lines": st.written_lines,
                "buffered_lines": st.buffered_lines, "dropped_lines": st.dropped_lines,
                "last_error": st.last_error,
            }  # fmt: skip
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            for e in result["events"]:
                print(f"{e['t_s']:8.2f}s  {e['kind']:<12} {e['target']}  {e['detail']}")
        return stop.exit_code()
    from tui.demo_app import DemoApp

    # Interactive: start with no scripted faults, the operator injects them with keys.
    runner = DemoRunner(replace(sc, faults=()), step_s=args.step)
    api = _serve(runner, listen, getattr(args, "token", None))
    writer = demo_timeseries(runner, url)
    try:
        DemoApp(runner, threshold_ns=args.threshold_us * 1e3).run()
    finally:
        if writer is not None:
            writer.close(10.0)
        if api is not None:
            api.stop()
    return 0


def _serve(runner: DemoRunner, listen: str | None, token: str | None) -> DemoApi | None:
    """With ``listen``, serve the API (printing its URL and token on stderr); else None."""
    if not listen:
        return None
    tok = token or new_token()
    api = DemoApi(runner, listen, tok)
    api.url = api.start()
    print(f"qpmesh demo: API on {api.url} (operator token: {tok})", file=sys.stderr, flush=True)
    return api
