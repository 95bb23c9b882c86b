"""The one validator of qpmesh's TOML files (prober, controller, scenario): typed reads.

A `Table` wraps one TOML table and reads its keys with the type they must have; every problem
is one exception (the caller's own class, a ValueError) whose message names the file and the
key: ``prober.toml: mqtt.port: must be an integer in 1..65535, got 0``. The rules:

- types are strict (`contract.kinds`): ``use_uncoded = "false"`` is not a bool, ``port = "3"``
  is not an integer, ``true`` is not 1; an integer is accepted where a number is wanted;
- unknown keys are errors (a typo must not silently fall back to a default): call `finish`
  once every key of a table was read;
- nothing is coerced and nothing is read from the environment; the module does no I/O.

Usage::

    root = Table.root(parse_toml(text, "c.toml", ConfigError), "c.toml", ConfigError)
    sync = root.table("sync")
    window_s = sync.get("window_s", float, 10.0, lambda v: v > 0, "a duration > 0 s")
    sync.finish()
    root.finish()
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from contract.kinds import as_kind, is_kind, kind_name

T = TypeVar("T")
D = TypeVar("D")


class TomlError(ValueError):
    """A TOML file is invalid (the default error class of `Table`)."""


def parse_toml(
    text: str | bytes, source: str, error: type[ValueError] = TomlError
) -> dict[str, Any]:
    """Return the document in ``text``; raise ``error`` (``source: not valid TOML: ...``)."""
    try:
        return tomllib.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{source}: not valid TOML: {exc}") from None


class Table:
    """Typed reads of one TOML table; errors name ``source: path.key``."""

    def __init__(
        self,
        source: str,
        path: str,
        values: Mapping[str, Any],
        error: type[ValueError] = TomlError,
    ) -> None:
        self.source, self.path, self.values, self.error = source, path, values, error
        self.used: set[str] = set()

    @classmethod
    def root(
        cls, doc: Mapping[str, Any], source: str, error: type[ValueError] = TomlError
    ) -> Table:
        """Return the top-level table of a parsed document."""
        return cls(source, "", doc, error)

    def where(self, key: str) -> str:
        """Return the dotted name of ``key`` in this table (``mqtt.port``, ``nics[0].id``)."""
        return f"{self.path}.{key}" if self.path else key

    def err(self, key: str, msg: str) -> ValueError:
        """Return the error for ``key`` (``source: path.key: msg``), for the caller to raise."""
        return self.error(f"{self.source}: {self.where(key)}: {msg}")

    def has(self, key: str) -> bool:
        """Return True if the table sets ``key``."""
        return key in self.values

    def get(
        self,
        key: str,
        kind: type[T],
        default: T,
        check: Callable[[T], bool] | None = None,
        want: str = "",
    ) -> T:
        """Return ``key`` as ``kind`` (``default`` if unset), passing ``check`` if given."""
        self.used.add(key)
        if key not in self.values:
            return default
        value = self.values[key]
        if not is_kind(value, kind):
            raise self.err(key, f"must be {want or kind_name(kind)}, got {value!r}")
        out: T = as_kind(value, kind)
        if check is not None and not check(out):
            raise self.err(key, f"must be {want}, got {value!r}")
        return out

    def require(
        self,
        key: str,
        kind: type[T],
        check: Callable[[T], bool] | None = None,
        want: str = "",
    ) -> T:
        """Like `get` for a key that must be set."""
        if key not in self.values:
            raise self.err(key, "is required")
        value: T = self.get(key, kind, None, check, want)  # type: ignore[arg-type,assignment]
        return value

    def table(self, key: str) -> Table:
        """Return the sub-table ``key`` (empty if unset); raise if it is not a table."""
        self.used.add(key)
        value = self.values.get(key, {})
        if not isinstance(value, dict):
            raise self.err(key, f"must be a table, got {value!r}")
        return Table(self.source, self.where(key), value, self.error)

    def tables(self, key: str) -> list[Table]:
        """Return the array of tables ``key`` (``[[key]]``; empty if unset)."""
        self.used.add(key)
        value = self.values.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.err(key, f"must be an array of tables ([[{self.where(key)}]])")
        return [Table(self.source, f"{self.where(key)}[{i}]", v, self.error)
                for i, v in enumerate(value)]  # fmt: skip

    def mapping(self, key: str, kind: type[T], want: str = "") -> dict[str, T]:
        """Return the table ``key`` whose keys are free (names, addresses) and whose values
        are all ``kind``, as a dict (empty if unset)."""
        sub = self.table(key)
        out: dict[str, T] = {}
        for k in sub.values:
            out[k] = sub.require(k, kind, want=want)
        return out

    def dataclass(self, default: D) -> D:
        """Return ``default`` (a dataclass instance) with the keys this table sets.

        Every field is read with the type of its default value; a field whose default is a
        dataclass is read from the sub-table of that name. Unknown keys are errors, and so
        is what the dataclass's own validation rejects (named after this table).
        """
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(default):  # type: ignore[arg-type]
            if not f.init or f.name not in self.values:
                continue
            cur = getattr(default, f.name)
            if dataclasses.is_dataclass(cur) and not isinstance(cur, type):
                changes[f.name] = self.table(f.name).dataclass(cur)
            else:
                changes[f.name] = self.get(f.name, type(cur), cur)
        self.finish()
        try:
            return dataclasses.replace(default, **changes)  # type: ignore[type-var]
        except ValueError as exc:
            where = f"{self.source}: {self.path}" if self.path else self.source
            raise self.error(f"{where}: {exc}") from None

    def finish(self) -> None:
        """Raise for the first key of this table that nothing read (an unknown key)."""
        extra = sorted(set(self.values) - self.used)
        if extra:
            table = isinstance(self.values[extra[0]], dict)
            raise self.err(extra[0], "unknown section" if table else "unknown key")
