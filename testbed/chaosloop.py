"""``python -m testbed.chaosloop TEST [TEST ...] --runs N``: a test run N times in a row beside
CPU burners, with its pass count (flaky tests are bugs, issue 32).

Each run is a fresh ``pytest -q -p no:cacheprovider TEST`` in its own process with its own
``--basetemp`` under ``--out`` (so a failed run's files, e.g. a testbed run's capture, are
kept); the burners (``--burners`` processes spinning on the CPU, at ``--burner-nice``) start
before the first run and are stopped by pid after the last, also when the loop is
interrupted. Pure: `pytest_argv`, `summarize`; the rest is the thin shell. Prints one JSON
document (``--json``) or a line per test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BURN = "while True: pass"
TAIL = 3000


@dataclass(frozen=True, slots=True)
class Outcome:
    """One run of one test: its exit status, wall seconds and the end of its output."""

    test: str
    run: int
    rc: int
    seconds: float
    tail: str = ""

    @property
    def passed(self) -> bool:
        """True when pytest exited 0."""
        return self.rc == 0


def pytest_argv(python: str, test: str, basetemp: Path, extra: Sequence[str] = ()) -> list[str]:
    """Return the command line of one run of ``test``."""
    return [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={basetemp}",
            *extra, test]  # fmt: skip


def summarize(outcomes: Sequence[Outcome]) -> dict[str, dict[str, Any]]:
    """Return per test: ``runs``, ``passed``, ``failed_runs`` (run numbers), the median and
    the longest wall seconds."""
    out: dict[str, dict[str, Any]] = {}
    for test in dict.fromkeys(o.test for o in outcomes):
        mine = [o for o in outcomes if o.test == test]
        secs = sorted(o.seconds for o in mine)
        out[test] = {
            "runs": len(mine),
            "passed": sum(o.passed for o in mine),
            "failed_runs": [o.run for o in mine if not o.passed],
            "median_s": round(secs[len(secs) // 2], 1),
            "max_s": round(secs[-1], 1),
        }
    return out


@contextlib.contextmanager
def burners(n: int, nice: int) -> Iterator[list[int]]:
    """Run ``n`` CPU-spinning processes at niceness ``nice`` for the ``with`` block; they are
    killed by pid when it ends (also on an exception)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen(
                [sys.executable, "-c", BURN], preexec_fn=lambda: os.nice(nice),  # noqa: PLW1509
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))  # fmt: skip
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def run_loop(
    tests: Sequence[str],
    runs: int,
    out: Path,
    *,
    n_burners: int = 1,
    nice: int = 0,
    extra: Sequence[str] = (),
    progress: Any = None,
    interleave: bool = False,
) -> list[Outcome]:
    """Run every test of ``tests`` ``runs`` times beside the burners; return the outcomes.

    Test by test, or with ``interleave`` round by round (run 1 of each test, then run 2 ...),
    so a loop stopped early has the same count of each. A failed run's output goes to
    ``out/<test>-<run>.log``; every run appends one JSON line (test, run, rc, seconds, the load
    average at its end, its end time) to ``out/runs.jsonl`` as it ends."""
    done: list[Outcome] = []
    with burners(n_burners, nice):
        for test, i in run_order(tests, runs, interleave=interleave):
            safe = test.replace("/", "_").replace(":", "_")
            t0 = time.monotonic()
            p = subprocess.run(
                pytest_argv(sys.executable, test, out / f"{safe}-{i}", extra),
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            o = Outcome(test, i, p.returncode, time.monotonic() - t0,
                        (p.stdout + p.stderr)[-TAIL:])  # fmt: skip
            if not o.passed:
                (out / f"{safe}-{i}.log").write_text(p.stdout + p.stderr)
            done.append(o)
            line = {"test": test, "run": i, "rc": o.rc, "seconds": round(o.seconds, 1),
                    "load_avg": os.getloadavg(), "ended": time.time()}  # fmt: skip
            with (out / "runs.jsonl").open("a") as f:
                f.write(json.dumps(line) + "\n")
            if progress is not None:
                progress(f"{test} run {i}/{runs}: {'pass' if o.passed else 'FAIL'} "
                         f"in {o.seconds:.0f} s")  # fmt: skip
    return done


def run_order(tests: Sequence[str], runs: int, *, interleave: bool) -> list[tuple[str, int]]:
    """Return the (test, run number) pairs in the order they run: test by test, or round by
    round with ``interleave``."""
    if interleave:
        return [(t, i) for i in range(1, runs + 1) for t in tests]
    return [(t, i) for t in tests for i in range(1, runs + 1)]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the loop; return 0 when every run passed, 1 otherwise."""
    p = argparse.ArgumentParser(prog="python -m testbed.chaosloop", description=__doc__)
    p.add_argument("tests", nargs="+", help="pytest node ids or files")
    p.add_argument("--runs", type=int, default=5, help="runs of each test (default %(default)s)")
    p.add_argument("--burners", type=int, default=1,
                   help="CPU-spinning processes beside the runs (default %(default)s)")  # fmt: skip
    p.add_argument("--burner-nice", type=int, default=0, help="their niceness (default 0)")
    p.add_argument("--out", default="/var/tmp/qpmesh/chaosloop",
                   help="kept files and failed runs' logs (default %(default)s)")  # fmt: skip
    p.add_argument("--interleave", action="store_true",
                   help="run round by round (each test once, then again) instead of test by test")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    a = p.parse_args(argv)
    if a.runs < 1 or a.burners < 0:
        p.error("--runs must be >= 1 and --burners >= 0")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    outcomes = run_loop(a.tests, a.runs, out, n_burners=a.burners, nice=a.burner_nice,
                        interleave=a.interleave,
                        progress=lambda m: print(m, file=sys.stderr, flush=True))  # fmt: skip
    summary = summarize(outcomes)
    doc = {"burners": a.burners, "burner_nice": a.burner_nice, "started": t0,
           "load_avg_end": os.getloadavg(), "tests": summary, "out": str(out)}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(doc, indent=1))
    if a.json:
        print(json.dumps(doc))
    else:
        for test, s in summary.items():
            print(f"{test}: {s['passed']}/{s['runs']} passed (failed runs {s['failed_runs']}), "
                  f"median {s['median_s']} s")  # fmt: skip
    return 0 if all(s["passed"] == s["runs"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
