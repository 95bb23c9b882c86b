"""A broker client's connection settings, as the config files spell them: one shape for MQTT
(`mqttlink.settings.BrokerSettings`, ``[mqtt]``) and NATS (`natslink.settings.NatsSettings`,
``[nats]``).

`MqttSecurity` holds TLS and credentials (file names, never a secret; the name is the
``[mqtt]`` table's, where the keys were first read, and ``[nats]`` takes the same keys);
`ClientLink` the request timeout, the reconnect loop's backoff bounds and the drain on stop
that every broker client has, validated once. `read_link` reads these keys from a config
table through the one TOML validator (`contract.tomlcheck`), `read_security` the TLS and
credential keys alone. Nothing here speaks a protocol: the client arguments are made in
`mqttlink.settings` (aiomqtt, paho) and `natslink.settings` (nats-py).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.tomlcheck import Table


def backoff_delay(attempt: int, lo_s: float, hi_s: float) -> float:
    """Return the wait before reconnect attempt ``attempt`` (0-based): lo * 2**attempt, capped.

    Raises ValueError unless attempt >= 0 and 0 < lo <= hi.
    """
    if attempt < 0 or lo_s <= 0 or hi_s < lo_s:
        raise ValueError("backoff needs attempt >= 0 and 0 < lo <= hi")
    return min(hi_s, lo_s * (2.0 ** min(attempt, 60)))


class CredentialError(ValueError):
    """A TLS or credential setting is unusable (missing or unreadable file, a secret file
    readable by group or others); the message names the file, never its content."""


def _check_file(path: str, what: str, *, secret: bool) -> None:
    """Raise `CredentialError` unless ``path`` is a readable file (and, if ``secret``, not
    readable by group or others)."""
    try:
        st = os.stat(path)
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise CredentialError(f"{what} {path}: cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CredentialError(f"{what} {path}: not a regular file")
    if secret and st.st_mode & 0o077:
        raise CredentialError(
            f"{what} {path}: readable by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it"
        )


def read_password(path: str) -> str:
    """Return the password in file ``path`` (its first line, without the line end).

    Raises `CredentialError` (naming the file, never its content) if it cannot be read, is
    readable by group or others or is empty.
    """
    _check_file(path, "password file", secret=True)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialError(f"password file {path}: cannot read: {exc}") from None
    password = text.splitlines()[0] if text else ""
    if not password:
        raise CredentialError(f"password file {path}: empty")
    return password


@dataclass(frozen=True, slots=True)
class MqttSecurity:
    """TLS and credentials of one broker client (MQTT or NATS); holds file names, never a secret.

    ``tls``: connect with TLS (verified against ``ca_file``, or the system CAs if empty; the
    broker's certificate must name the host the client connects to). ``cert_file`` and
    ``key_file``: a client certificate (both or neither). ``username`` and
    ``password_file``: the broker's credentials; the password is read from the file at each connect
    (`read_password`). Raises ValueError on an inconsistent combination.
    """

    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    username: str = ""
    password_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file go together")
        if not self.tls and (self.ca_file or self.cert_file):
            raise ValueError("ca_file and cert_file need tls = true")
        if self.password_file and not self.username:
            raise ValueError("password_file needs a username")

    def check(self) -> None:
        """Raise `CredentialError` unless every named file can be read (and the key and
        password files are not readable by group or others)."""
        for path, what, secret in (
            (self.ca_file, "ca_file", False),
            (self.cert_file, "cert_file", False),
            (self.key_file, "key_file", True),
            (self.password_file, "password file", True),
        ):
            if path:
                _check_file(path, what, secret=secret)

    def describe(self) -> dict[str, Any]:
        """Return what may be shown (``--dry-run``, logs): file names, no secret."""
        return {
            "tls": self.tls,
            "ca_file": self.ca_file,
            "cert_file": self.cert_file,
            "username": self.username,
            "password": "from file" if self.password_file else "",
        }


def read_security(table: Table, base_dir: Path | None = None) -> MqttSecurity:
    """Return the TLS and credential keys of a config's MQTT ``table`` (``tls``, ``ca_file``,
    ``cert_file``, ``key_file``, ``username``, ``password_file``; relative paths are taken
    from ``base_dir``), the files checked. Raises the table's error (one line naming the file
    and key) on a bad value or an unreadable file; leaves the other keys to the caller."""

    def path(key: str) -> str:
        value = table.get(key, str, "")
        if value and base_dir is not None and not os.path.isabs(value):
            value = str(base_dir / value)
        return value

    try:
        sec = MqttSecurity(
            tls=table.get("tls", bool, False),
            ca_file=path("ca_file"),
            cert_file=path("cert_file"),
            key_file=path("key_file"),
            username=table.get("username", str, "", _username_ok, "a user name"),
            password_file=path("password_file"),
        )
        sec.check()
    except ValueError as exc:
        if isinstance(exc, table.error):
            raise
        raise table.error(f"{table.source}: {table.path or 'mqtt'}: {exc}") from None
    return sec


def _username_ok(value: str) -> bool:
    return bool(value) and not any(c.isspace() or c in "#+/" for c in value)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientLink:
    """What every broker client of qpmesh has, whichever broker; validated (ValueError).

    ``timeout_s``: every request; ``backoff_min_s``/``backoff_max_s``: the reconnect loop's
    waits (`backoff_delay`); ``drain_on_stop_s``: how long a stopping publisher keeps sending
    what it spooled; ``security``: TLS and credentials. A broker's settings extend it with
    where the broker is (keyword-only here, so theirs keep their positions).
    """

    timeout_s: float = 5.0
    backoff_min_s: float = 0.2
    backoff_max_s: float = 5.0
    drain_on_stop_s: float = 5.0
    security: MqttSecurity = field(default_factory=MqttSecurity)

    def __post_init__(self) -> None:
        self.check_link()

    def check_link(self) -> None:
        """Raise ValueError unless the timeout is positive, the drain not negative and the
        backoff bounds 0 < min <= max (a subclass's ``__post_init__`` calls it)."""
        if self.timeout_s <= 0 or self.drain_on_stop_s < 0:
            raise ValueError("timeout must be positive and drain_on_stop_s not negative")
        backoff_delay(0, self.backoff_min_s, self.backoff_max_s)


def read_link(table: Table, base_dir: Path | None = None) -> dict[str, Any]:
    """Return the `ClientLink` keywords a broker's config ``table`` sets: ``timeout_s`` (in
    (0, 600]), ``backoff_min_s`` (in (0, 60]), ``backoff_max_s`` (in (0, 600]) and
    ``security`` (`read_security`, files relative to ``base_dir``). Raises the table's error
    (one line naming the file and key); leaves the other keys to the caller."""
    return {
        "timeout_s": table.get("timeout_s", float, 5.0, lambda v: 0 < v <= 600, "in (0, 600]"),
        "backoff_min_s": table.get("backoff_min_s", float, 0.2, lambda v: 0 < v <= 60, "(0, 60]"),
        "backoff_max_s": table.get("backoff_max_s", float, 5.0, lambda v: 0 < v <= 600, "(0, 600]"),
        "security": read_security(table, base_dir),
    }
