"""Real alerting servers for tests: Debian's ``prometheus-alertmanager`` and ``vmalert``.

Each runs on a free loopback port with its own temporary directory, is started with
`start()` and stopped by its PID with `stop()` (SIGTERM, then SIGKILL), also when a test
fails (use them as context managers or call `stop` in ``finally``). Alertmanager clustering is
off (no gossip port); its API and webhook receivers are what the tests look at.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Self

import yaml

from tests.servers import free_port, stop_process

ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
VMALERT = shutil.which("vmalert") or "/usr/bin/vmalert"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}); see {log}")  # type: ignore[index]
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in {timeout_s:g} s; see {log}")


class _Server:
    """One private server process on a free loopback port: `start` runs ``argv()`` with its
    output in ``<dir>/<name>.log`` and waits until ``ready_path`` answers 200 (stopping it if
    not); `stop` ends it by its PID. Subclasses say what to run."""

    name = ""
    ready_path = ""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout_s: float = 30.0) -> None:
        log = self.dir / f"{self.name}.log"
        argv = self.argv()
        with log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_http(f"{self.url}{self.ready_path}", self.proc, log, timeout_s)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        stop_process(self.proc, timeout_s=15)
        self.proc = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Alertmanager(_Server):
    """One private Alertmanager; ``webhook`` (URL, optional bearer token) receives every
    alert group (group_wait 1 s)."""

    name, ready_path = "alertmanager", "/-/ready"

    def __init__(self, workdir: Path, port: int | None = None,
                 webhook: tuple[str, str | None] | None = None) -> None:  # fmt: skip
        super().__init__(workdir, port)
        self.webhook = webhook

    def config(self) -> dict[str, Any]:
        receiver: dict[str, Any] = {"name": "qpmesh"}
        if self.webhook is not None:
            hook: dict[str, Any] = {"url": self.webhook[0], "send_resolved": False}
            if self.webhook[1]:
                hook["http_config"] = {"authorization": {"credentials": self.webhook[1]}}
            receiver["webhook_configs"] = [hook]
        return {
            "route": {"receiver": "qpmesh", "group_by": ["alertname", "link"],
                      "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [receiver],
        }  # fmt: skip

    def argv(self) -> list[str]:
        conf = self.dir / "alertmanager.yml"
        conf.write_text(yaml.safe_dump(self.config()))
        return [ALERTMANAGER, f"--config.file={conf}", f"--storage.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=",
                "--log.level=warn"]  # fmt: skip

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """Return ``GET /api/v2/alerts`` (``filters``: its query parameters)."""
        q = "&".join(f"{k}={v}" for k, v in filters.items())
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts?{q}", timeout=10) as r:
            return list(json.loads(r.read()))


class VmAlert(_Server):
    """One private vmalert evaluating ``rules`` against ``datasource``, notifying
    ``notifier`` (an Alertmanager URL)."""

    name, ready_path = "vmalert", "/health"

    def __init__(self, workdir: Path, rules: Path, datasource: str, notifier: str) -> None:
        super().__init__(workdir)
        self.rules, self.datasource, self.notifier = rules, datasource, notifier

    def argv(self) -> list[str]:
        return [VMALERT, f"-rule={self.rules}", f"-datasource.url={self.datasource}",
                f"-notifier.url={self.notifier}", f"-httpListenAddr=127.0.0.1:{self.port}",
                "-evaluationInterval=1s", "-loggerLevel=ERROR"]  # fmt: skip

    def alerts(self) -> list[dict[str, Any]]:
        """Return vmalert's own view of its alerts (``/api/v1/alerts``)."""
        with urllib.request.urlopen(f"{self.url}/api/v1/alerts", timeout=10) as r:
            return list(json.loads(r.read())["data"]["alerts"] or [])
