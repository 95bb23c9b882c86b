"""``[timeseries]`` and ``[metrics]`` of the controller config: validated frozen values.

`timeseries_config(doc, base_dir)` / `metrics_config(doc)` read the tables (plain mappings
from the TOML document) and raise `ValueError` with a one-line message naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from controller.timeseries.metrics import parse_listen
from controller.timeseries.stats import PATH_DETAIL
from controller.timeseries.writer import DEFAULT_BUFFER_BYTES, DEFAULT_INTERVAL_S


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
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"timeseries.url must be http(s)://HOST[:PORT], got {self.url!r}")
        if not self.interval_s > 0:
            raise ValueError("timeseries.interval_s must be > 0")
        if self.buffer_bytes <= 0:
            raise ValueError("timeseries.buffer_mb must be > 0")
        if self.path_detail not in PATH_DETAIL:
            raise ValueError(f"timeseries.path_detail must be one of {', '.join(PATH_DETAIL)}")


def _typed(table: Mapping[str, Any], key: str, kind: type | tuple[type, ...], want: str) -> Any:
    v = table[key]
    if isinstance(v, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ValueError(f"timeseries.{key} must be {want}, got {v!r}")
    if not isinstance(v, kind):
        raise ValueError(f"timeseries.{key} must be {want}, got {v!r}")
    return v


def timeseries_config(
    table: Mapping[str, Any] | None, base_dir: Path | None = None
) -> TimeseriesConfig | None:
    """Return the ``[timeseries]`` settings (None when the table or its ``url`` is absent).

    Keys: ``url``, ``org``, ``bucket``, ``token_file`` (read here, relative to ``base_dir``),
    ``interval_s``, ``buffer_mb``, ``path_detail``, ``pairs``. Raises ValueError (one line)."""
    if not table:
        return None
    known = {"url", "org", "bucket", "token_file", "interval_s", "buffer_mb", "path_detail",
             "pairs"}  # fmt: skip
    if extra := sorted(set(table) - known):
        raise ValueError(f"unknown timeseries key(s): {', '.join(extra)}")
    if "url" not in table:
        raise ValueError("timeseries.url is required (or leave out [timeseries])")
    kw: dict[str, Any] = {"url": _typed(table, "url", str, "a URL")}
    for key in ("org", "bucket", "path_detail"):
        if key in table:
            kw[key] = _typed(table, key, str, "a string")
    if "interval_s" in table:
        kw["interval_s"] = float(_typed(table, "interval_s", (int, float), "a number"))
    if "buffer_mb" in table:
        mb = float(_typed(table, "buffer_mb", (int, float), "a number"))
        kw["buffer_bytes"] = int(mb * 1024 * 1024)
    if "pairs" in table:
        kw["pairs"] = _typed(table, "pairs", bool, "true or false")
    if "token_file" in table:
        path = Path(_typed(table, "token_file", str, "a path"))
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        try:
            kw["token"] = path.read_text().strip()
        except OSError as exc:
            raise ValueError(f"timeseries.token_file {path}: {exc.strerror}") from None
    return TimeseriesConfig(**kw)


def metrics_config(table: Mapping[str, Any] | None) -> str | None:
    """Return ``[metrics] listen`` (``HOST:PORT``) or None; raises ValueError (one line)."""
    if not table:
        return None
    if extra := sorted(set(table) - {"listen"}):
        raise ValueError(f"unknown metrics key(s): {', '.join(extra)}")
    listen = table.get("listen")
    if not isinstance(listen, str):
        raise ValueError(f"metrics.listen must be HOST:PORT, got {listen!r}")
    parse_listen(listen)
    return listen
