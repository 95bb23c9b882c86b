"""Where and how to reach the MQTT broker, and the errors of the broker boundary.

The one place for MQTT settings: `BrokerSettings` (address, keepalive, and the timeout,
backoff and `MqttSecurity` (TLS, client certificate, user name and password file) of
`contract.connection.ClientLink`, the shape NATS shares); every MQTT client of qpmesh gets
its connection arguments from `client_kwargs` (aiomqtt) or `configure_paho` (paho), config
files read the keys with `contract.connection.read_link`/`read_security`, commands take the
options of `add_security_args`. Secrets stay in files: nothing here returns a password except
`client_kwargs`/`read_password`, whose result goes straight into the client.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import aiomqtt

from contract.connection import (
    ClientLink,
    CredentialError,
    MqttSecurity,
    backoff_delay,
    read_password,
    read_security,
)
from contract.topics import DEFAULT_PREFIX, Topics

# the shared connection shape (`contract.connection`), also reached from here by MQTT clients
__all__ = [
    "BROKER_ERRORS",
    "BrokerSettings",
    "ClientLink",
    "CredentialError",
    "MqttSecurity",
    "add_security_args",
    "backoff_delay",
    "client_kwargs",
    "configure_paho",
    "read_password",
    "read_security",
    "security_from_args",
]


# A credential file that went away after the start is retried like an unreachable broker.
BROKER_ERRORS: tuple[type[BaseException], ...] = (
    aiomqtt.MqttError,
    OSError,
    TimeoutError,
    CredentialError,
)


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
class BrokerSettings(ClientLink):
    """Where and how to reach the broker; validated (ValueError). The timeout, backoff,
    drain and security are `contract.connection.ClientLink`'s (keyword-only)."""

    host: str = "127.0.0.1"
    port: int = 1883
    prefix: str = DEFAULT_PREFIX
    keepalive_s: int = 10

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("broker host must not be empty")
        if not 0 < self.port <= 0xFFFF:
            raise ValueError(f"broker port {self.port} out of range")
        Topics(self.prefix)  # raises TopicError (a ValueError) on a bad prefix
        if self.keepalive_s <= 0:
            raise ValueError("keepalive must be positive")
        self.check_link()
