"""Key files: the per-fabric probe HMAC keys and the remediation signing keys.

One small TOML format for every key qpmesh reads (see docs/security.md)::

    # qpmesh key file: mode 0600 (a secret key file readable by group or others is refused)
    send = "2026-11"              # optional: the key used to send/sign (default: the last one)

    [[keys]]
    id = "2026-10"                # 1-64 of [A-Za-z0-9_.:-]
    type = "hmac-sha256"          # one of KEY_TYPES, the same for every key of the file
    hex = "9f86d0...e3b0"         # the key material: hex = "..." or base64 = "..."

    [[keys]]                      # a second key only during a rotation
    id = "2026-11"
    type = "hmac-sha256"
    hex = "..."

Types: ``hmac-sha256`` (probe authentication, 16..64 bytes, 32 recommended),
``ed25519-private`` (the controller's remediation signing key, the 32-byte seed) and
``ed25519-public`` (the recovery agents' verify key, 32 bytes). A file holds one or two keys
of one type: every key verifies, the ``send`` key (the newer one, during a rotation) is the
one used to send or sign.

`parse_key_file` is pure (text in, `KeySet` out); `load_key_file` is the one read: it checks
the file's mode first (secret types only) and raises `KeyFileError` (a ValueError: exit 2)
with one line naming the file, never the key material. `KeySet` and `Key` never print their
secret (``repr`` shows ids only).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from contract.tomlcheck import Table, parse_toml

HMAC = "hmac-sha256"
ED25519_PRIVATE = "ed25519-private"
ED25519_PUBLIC = "ed25519-public"
KEY_TYPES = (HMAC, ED25519_PRIVATE, ED25519_PUBLIC)
SECRET_TYPES = (HMAC, ED25519_PRIVATE)
MAX_KEYS = 2
_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_SIZES = {HMAC: (16, 64), ED25519_PRIVATE: (32, 32), ED25519_PUBLIC: (32, 32)}


class KeyFileError(ValueError):
    """A key file is missing, too open, or malformed; the message names the file, not the key."""


@dataclass(frozen=True, slots=True)
class Key:
    """One key: its ``id``, ``type`` (one of `KEY_TYPES`) and ``material`` (never in repr)."""

    id: str
    type: str
    material: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class KeySet:
    """The keys of one file (one type); ``send_id`` names the key that sends or signs."""

    keys: tuple[Key, ...]
    send_id: str
    source: str = "<keys>"

    def __post_init__(self) -> None:
        if not 1 <= len(self.keys) <= MAX_KEYS:
            raise KeyFileError(f"{self.source}: keys: one or {MAX_KEYS} keys, got {len(self.keys)}")
        if len({k.type for k in self.keys}) != 1:
            raise KeyFileError(f"{self.source}: keys: every key of a file has the same type")
        if len({k.id for k in self.keys}) != len(self.keys):
            raise KeyFileError(f"{self.source}: keys: duplicate key id")
        if self.send_id not in {k.id for k in self.keys}:
            raise KeyFileError(f"{self.source}: send: no key with id {self.send_id!r}")

    @property
    def type(self) -> str:
        """Return the type of the file's keys."""
        return self.keys[0].type

    @property
    def send(self) -> Key:
        """Return the key used to send or sign."""
        return next(k for k in self.keys if k.id == self.send_id)

    def by_id(self, key_id: str) -> Key | None:
        """Return the key with ``key_id``, or None."""
        return next((k for k in self.keys if k.id == key_id), None)

    def others(self) -> tuple[Key, ...]:
        """Return the keys that verify but do not send (the old one during a rotation)."""
        return tuple(k for k in self.keys if k.id != self.send_id)

    def describe(self) -> dict[str, object]:
        """Return what may be shown of this set (ids and type; never the material)."""
        return {"type": self.type, "send": self.send_id, "ids": [k.id for k in self.keys]}


def _material(t: Table, want_type: str) -> bytes:
    """Return the key bytes of one [[keys]] entry; errors never quote the value."""
    has_hex, has_b64 = t.has("hex"), t.has("base64")
    t.used.update(("hex", "base64"))
    if has_hex == has_b64:
        raise t.err("hex", "set exactly one of hex or base64")
    key = "hex" if has_hex else "base64"
    raw = t.values[key]
    if not isinstance(raw, str):
        raise t.err(key, "must be a string")
    try:
        data = bytes.fromhex(raw) if has_hex else base64.b64decode(raw, validate=True)
    except (ValueError, binascii.Error):
        raise t.err(key, f"is not valid {key}") from None
    lo, hi = _SIZES[want_type]
    if not lo <= len(data) <= hi:
        size = f"{lo}" if lo == hi else f"{lo}..{hi}"
        raise t.err(key, f"a {want_type} key has {size} bytes, this one has {len(data)}")
    return data


def parse_key_file(text: str | bytes, source: str, want_type: str | None = None) -> KeySet:
    """Return the keys in key-file ``text``; raise `KeyFileError` (one line, no key material).

    ``want_type`` (one of `KEY_TYPES`), when given, is the type every key must have.
    """
    root = Table.root(parse_toml(text, source, KeyFileError), source, KeyFileError)
    send = root.get("send", str, "", lambda v: bool(_ID.match(v)), "a key id")
    keys: list[Key] = []
    for t in root.tables("keys"):
        kid = t.require("id", str, lambda v: bool(_ID.match(v)), "1-64 of [A-Za-z0-9_.:-]")
        ktype = t.require("type", str, lambda v: v in KEY_TYPES, f"one of {', '.join(KEY_TYPES)}")
        if want_type is not None and ktype != want_type:
            raise t.err("type", f"must be {want_type} here, got {ktype!r}")
        keys.append(Key(kid, ktype, _material(t, ktype)))
        t.finish()
    root.finish()
    if not keys:
        raise KeyFileError(f"{source}: keys: at least one [[keys]] entry is required")
    return KeySet(tuple(keys), send or keys[-1].id, source)


def check_mode(path: Path | str, mode: int) -> None:
    """Raise `KeyFileError` if ``mode`` lets group or others read or write a secret file."""
    if mode & 0o077:
        raise KeyFileError(
            f"{path}: key file has mode {stat.S_IMODE(mode):04o}; a secret key file must not be "
            f"readable or writable by group or others (chmod 600 {path})"
        )


def load_key_file(path: Path | str, want_type: str | None = None) -> KeySet:
    """Read and parse the key file at ``path``; raise `KeyFileError` (one line, exit 2).

    Secret keys (`SECRET_TYPES`) are refused when the file is open to group or others; a
    missing or unreadable file is a `KeyFileError` too (the configuration names it).
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY)
    except FileNotFoundError:
        raise KeyFileError(f"{p}: key file not found") from None
    except OSError as exc:
        raise KeyFileError(f"{p}: cannot read the key file: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise KeyFileError(f"{p}: a key file must be a regular file")
        if want_type in SECRET_TYPES:
            check_mode(p, mode)  # before parsing: an open file is refused whatever it holds
        with os.fdopen(fd, "rb", closefd=False) as f:
            text = f.read(1 << 16)
    finally:
        os.close(fd)
    keys = parse_key_file(text, str(p), want_type)
    if keys.type in SECRET_TYPES:
        check_mode(p, mode)
    return keys


def format_key_file(keys: list[tuple[str, str, bytes]], send: str = "") -> str:
    """Return the text of a key file holding ``keys`` ((id, type, material) triples)."""
    public = bool(keys) and all(t not in SECRET_TYPES for _, t, _ in keys)
    lines = [
        "# qpmesh key file (docs/security.md): "
        + ("a public verify key, may be readable by all" if public else "keep it mode 0600")
    ]
    if send:
        lines.append(f'send = "{send}"')
    for kid, ktype, material in keys:
        lines += ["", "[[keys]]", f'id = "{kid}"', f'type = "{ktype}"',
                  f'hex = "{material.hex()}"']  # fmt: skip
    return "\n".join(lines) + "\n"
