"""Where and how to reach the MQTT broker, and the errors of the broker boundary.

The one place for MQTT settings: `BrokerSettings` (address, timeouts, backoff) holds a
`MqttSecurity` (TLS, client certificate, user name and password file); every MQTT client of
qpmesh gets its connection arguments from `client_kwargs` (aiomqtt) or `configure_paho`
(paho), config files read the keys with `read_security`, commands take the options of
`add_security_args`. Secrets stay in files: nothing here returns a password except
`client_kwargs`/`read_password`, whose result goes straight into the client.
"""

from __future__ import annotations

import argparse
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiomqtt

from contract.tomlcheck import Table
from contract.topics import DEFAULT_PREFIX, Topics


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


# A credential file that went away after the start is retried like an unreachable broker.
BROKER_ERRORS: tuple[type[BaseException], ...] = (
    aiomqtt.MqttError,
    OSError,
    TimeoutError,
    CredentialError,
)


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
    """TLS and credentials of one MQTT client; holds file names, never a secret.

    ``tls``: connect with TLS (verified against ``ca_file``, or the system CAs if empty; the
    broker's certificate must name the host the client connects to). ``cert_file`` and
    ``key_file``: a client certificate (both or neither). ``username`` and
    ``password_file``: MQTT credentials; the password is read from the file at each connect
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


def client_kwargs(security: MqttSecurity) -> dict[str, Any]:
    """Return the `aiomqtt.Client` keyword arguments for ``security`` (``tls_params``,
    ``username``, ``password``; empty without TLS and credentials).

    Raises `CredentialError` if the password file cannot be read. The result holds the
    password: pass it to the client, never log it.
    """
    out: dict[str, Any] = {}
    if security.tls:
        out["tls_params"] = aiomqtt.TLSParameters(
            ca_certs=security.ca_file or None,
            certfile=security.cert_file or None,
            keyfile=security.key_file or None,
        )
    if security.username:
        out["username"] = security.username
        if security.password_file:
            out["password"] = read_password(security.password_file)
    return out


def configure_paho(client: Any, security: MqttSecurity) -> None:
    """Apply ``security`` to a paho-mqtt ``client`` (``tls_set``, ``username_pw_set``)
    before it connects; raises `CredentialError` like `client_kwargs`."""
    kw = client_kwargs(security)
    tls = kw.get("tls_params")
    if tls is not None:
        client.tls_set(ca_certs=tls.ca_certs, certfile=tls.certfile, keyfile=tls.keyfile)
    if "username" in kw:
        client.username_pw_set(kw["username"], kw.get("password"))


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


def add_security_args(parser: argparse.ArgumentParser) -> None:
    """Add the MQTT TLS and credential options (``--mqtt-tls``, ``--mqtt-ca``,
    ``--mqtt-cert``, ``--mqtt-key``, ``--mqtt-user``, ``--mqtt-password-file``)."""
    g = parser.add_argument_group("MQTT TLS and credentials (docs/mqtt-security.md)")
    g.add_argument("--mqtt-tls", action="store_true",
                   help="connect with TLS (implied by --mqtt-ca and --mqtt-cert)")  # fmt: skip
    g.add_argument("--mqtt-ca", default="", metavar="FILE",
                   help="CA certificate(s) to verify the broker with (default: system CAs)")  # fmt: skip
    g.add_argument("--mqtt-cert", default="", metavar="FILE", help="client certificate (PEM)")
    g.add_argument("--mqtt-key", default="", metavar="FILE",
                   help="client certificate's private key (PEM, not readable by group or others)")  # fmt: skip
    g.add_argument("--mqtt-user", default="", metavar="NAME", help="MQTT user name")
    g.add_argument("--mqtt-password-file", default="", metavar="FILE",
                   help="file whose first line is the MQTT password (not readable by group or others; "
                        "there is no option that takes the password itself)")  # fmt: skip


def security_from_args(args: argparse.Namespace) -> MqttSecurity:
    """Return the `MqttSecurity` of the `add_security_args` options, files checked.

    Raises ValueError (`CredentialError` for an unusable file) with one line.
    """
    sec = MqttSecurity(
        tls=bool(args.mqtt_tls or args.mqtt_ca or args.mqtt_cert),
        ca_file=args.mqtt_ca,
        cert_file=args.mqtt_cert,
        key_file=args.mqtt_key,
        username=args.mqtt_user,
        password_file=args.mqtt_password_file,
    )
    sec.check()
    return sec


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """Where and how to reach the broker; validated (ValueError)."""

    host: str = "127.0.0.1"
    port: int = 1883
    prefix: str = DEFAULT_PREFIX
    keepalive_s: int = 10
    timeout_s: float = 5.0
    backoff_min_s: float = 0.2
    backoff_max_s: float = 5.0
    drain_on_stop_s: float = 5.0
    security: MqttSecurity = field(default_factory=MqttSecurity)

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("broker host must not be empty")
        if not 0 < self.port <= 0xFFFF:
            raise ValueError(f"broker port {self.port} out of range")
        Topics(self.prefix)  # raises TopicError (a ValueError) on a bad prefix
        if self.keepalive_s <= 0 or self.timeout_s <= 0 or self.drain_on_stop_s < 0:
            raise ValueError("keepalive, timeout must be positive")
        backoff_delay(0, self.backoff_min_s, self.backoff_max_s)
