"""``[timeseries]`` and ``[metrics]`` of the controller config: validated frozen values.

`read_timeseries(table, base_dir)` and `read_metrics(table)` read the two tables through the
project's one TOML validator (`contract.tomlcheck.Table`: strict types, unknown keys are
errors, messages name the file and the key) and raise the table's error class (a ValueError).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from contract.tomlcheck import Table
from controller.timeseries.metrics import parse_listen
from controller.timeseries.stats import PATH_DETAIL
from controller.timeseries.writer import DEFAULT_BUFFER_BYTES, DEFAULT_INTERVAL_S


def _is_url(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


@dataclass(frozen=True, slots=True)
class TimeseriesConfig:
    """Where and how the controller writes its time series."""

    url: str
    org: str = "qpmesh"
    bucket: str = "qpmesh"
    token: str = ""
    interval_s: float = DEFAULT_INTERVAL_S
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    path_detail: str = "full"
    pairs: bool = True

    def __post_init__(self) -> None:
        if not _is_url(self.url):
            raise ValueError(f"timeseries url must be http(s)://HOST[:PORT], got {self.url!r}")
        if not self.interval_s > 0 or self.buffer_bytes <= 0:
            raise ValueError("timeseries interval and buffer must be > 0")
        if self.path_detail not in PATH_DETAIL:
            raise ValueError(f"timeseries path_detail must be one of {', '.join(PATH_DETAIL)}")


def read_timeseries(table: Table, base_dir: Path | None = None) -> TimeseriesConfig | None:
    """Return the ``[timeseries]`` settings, None when the table is empty (time series off).

    Keys: ``url`` (required), ``org``, ``bucket``, ``token_file`` (read here, relative to
    ``base_dir``), ``interval_s``, ``buffer_mb``, ``path_detail``, ``pairs``. Raises the
    table's error (one line naming the file and the key)."""
    if not table.values:
        return None
    url = table.require("url", str, _is_url, "an http(s)://HOST[:PORT] URL")
    org = table.get("org", str, "qpmesh", bool, "a non-empty string")
    bucket = table.get("bucket", str, "qpmesh", bool, "a non-empty string")
    pos = "a number > 0"
    interval_s = table.get("interval_s", float, DEFAULT_INTERVAL_S, lambda v: v > 0, pos)
    buffer_mb = table.get("buffer_mb", float, DEFAULT_BUFFER_BYTES / 2**20, lambda v: v > 0, pos)
    detail = table.get(
        "path_detail", str, "full", PATH_DETAIL.__contains__, " or ".join(PATH_DETAIL)
    )
    pairs = table.get("pairs", bool, True)
    token = ""
    token_file = table.get("token_file", str, "", bool, "a file name")
    if token_file:
        path = Path(token_file)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise table.err("token_file", f"cannot read {path}: {exc.strerror}") from None
    table.finish()
    return TimeseriesConfig(
        url, org, bucket, token, interval_s, int(buffer_mb * 2**20), detail, pairs
    )


def _is_listen(listen: str) -> bool:
    try:
        parse_listen(listen)
    except ValueError:
        return False
    return True


def read_metrics(table: Table) -> str | None:
    """Return ``[metrics] listen`` (``HOST:PORT``; port 0 = any free port) or None."""
    listen = table.get("listen", str, "", _is_listen, "HOST:PORT")
    table.finish()
    return listen or None
