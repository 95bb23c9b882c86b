"""A mosquitto set up like docs/mqtt-security.md: TLS, a password file and an ACL.

Used by the tests and by ``qpmesh testbed run --secure``. Pure parts: `acl_text` (the ACL
of docs/mqtt-security.md: probers publish only under their own host, only the controller publishes
events and remediation, a recovery agent reads only its NICs' actions) and `broker_conf`.
Thin shell: `make_material` generates a CA, the broker's certificate (for the addresses
clients connect to), a second, untrusted CA (for tests), random passwords (hashed with
``mosquitto_passwd -U``; each user's password in its own 0600 file) with the ``openssl`` and
``mosquitto_passwd`` commands (``.ci/setup`` installs both). Raises OSError (one line) when a
command is missing or fails.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mqttlink.settings import MqttSecurity

CONTROLLER_USER = "controller"
MONITOR_USER = "monitor"
CONTROLLER_READS = (
    "probes", "presence", "health", "paths", "neighbors", "remediation-ack", "jobs",
)  # fmt: skip


def agent_user(job: str, rank: int) -> str:
    """Return the MQTT user name of rank ``rank``'s recovery agent in ``job``."""
    return f"agent-{job}-r{rank}"


def acl_text(
    prefix: str,
    *,
    agents: Mapping[str, tuple[str, Sequence[str]]] | None = None,
    controller: str = CONTROLLER_USER,
    readers: Sequence[str] = (MONITOR_USER,),
) -> str:
    """Return a mosquitto ACL file for topic prefix ``prefix`` (pure).

    - probers: ``pattern`` lines, the user name (``%u``) is the host id; a prober publishes
      only on ``probes|presence|health|paths|neighbors/<its host>`` and reads presence (RDMA
      peers) and neighbours (its peers, with discovery);
    - ``controller``: reads everything the probers and agents publish, the only writer of
      ``events/#`` and ``remediation/#``;
    - ``agents``: user -> (job, NICs): reads ``remediation/<nic>`` of its NICs only, writes
      acks and its job's rank registrations;
    - ``readers``: read-only users of everything (the testbed's monitor).
    Mosquitto applies ``pattern`` lines to every user, so every user may also publish under
    ``<prefix>/probes/<its own user name>``: the controller drops batches from a host that
    is not in its fabric (docs/mqtt-security.md, "What the ACL does not do").
    """
    p = prefix
    lines = [
        "# qpmesh ACL (docs/mqtt-security.md). Probers log in with their host id as user name.",
        *(
            f"pattern write {p}/{kind}/%u"
            for kind in ("probes", "presence", "health", "paths", "neighbors")
        ),
        f"pattern read {p}/presence/+",
        f"pattern read {p}/neighbors/+",
        "",
        f"user {controller}",
        *(f"topic read {p}/{kind}/#" for kind in CONTROLLER_READS),
        f"topic readwrite {p}/events/#",
        f"topic readwrite {p}/remediation/#",
        "",
    ]
    for user in readers:
        lines += [f"user {user}", f"topic read {p}/#", ""]
    for user, (job, nics) in sorted((agents or {}).items()):
        lines += [f"user {user}"]
        lines += [f"topic read {p}/remediation/{nic}" for nic in nics]
        lines += [f"topic write {p}/remediation-ack/#", f"topic write {p}/jobs/{job}/#", ""]
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Material:
    """Files of one secure broker: CA, broker certificate, password and ACL files, and a
    0600 password file per user (``password_files``)."""

    dir: Path
    ca_file: Path
    cert_file: Path
    key_file: Path
    passwd_file: Path
    acl_file: Path
    rogue_ca_file: Path  # a CA that did not sign the broker (tests of an untrusted broker)
    password_files: dict[str, Path] = field(default_factory=dict)

    def security(self, user: str, *, ca_file: Path | None = None) -> MqttSecurity:
        """Return the client settings of ``user`` (TLS verified by ``ca_file``, default ours)."""
        return MqttSecurity(
            tls=True,
            ca_file=str(ca_file or self.ca_file),
            username=user,
            password_file=str(self.password_files[user]),
        )

    def wrong_password(self, user: str) -> MqttSecurity:
        """Return ``user``'s settings with a password file that holds a wrong password."""
        path = self.dir / f"{user}.wrong"
        _write_secret(path, "not-" + secrets.token_urlsafe(12) + "\n")
        return MqttSecurity(
            tls=True, ca_file=str(self.ca_file), username=user, password_file=str(path)
        )


def broker_conf(addr: str, port: int, m: Material) -> str:
    """Return the mosquitto configuration: one TLS listener, no anonymous clients (pure)."""
    return "\n".join([
        "per_listener_settings false",
        "allow_anonymous false",
        f"password_file {m.passwd_file}",
        f"acl_file {m.acl_file}",
        "persistence false",
        "user root" if os.geteuid() == 0 else "",  # keep reading the 0600 files as root
        f"listener {port} {addr}",
        f"cafile {m.ca_file}",
        f"certfile {m.cert_file}",
        f"keyfile {m.key_file}",
        "tls_version tlsv1.2",
        "log_dest stderr",
        "log_type error",
        "log_type warning",
        "log_type notice",
        "",
    ])  # fmt: skip


def _run(argv: list[str]) -> None:
    if shutil.which(argv[0]) is None:
        raise OSError(f"{argv[0]} not found (run .ci/setup)")
    r = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if r.returncode:
        err = (r.stderr or r.stdout).strip().splitlines()
        raise OSError(f"{argv[0]} {argv[1]} failed: {err[-1] if err else r.returncode}")


def _write_secret(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)


def _make_ca(d: Path, name: str) -> tuple[Path, Path]:
    crt, key = d / f"{name}.crt", d / f"{name}.key"
    _run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
          "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "30", "-subj", f"/CN={name}",
          "-addext", "basicConstraints=critical,CA:TRUE",
          "-addext", "keyUsage=critical,keyCertSign,cRLSign"])  # fmt: skip
    return crt, key


def _make_server_cert(d: Path, ca: tuple[Path, Path], addrs: Sequence[str]) -> tuple[Path, Path]:
    crt, key, csr, ext = d / "broker.crt", d / "broker.key", d / "broker.csr", d / "broker.ext"
    _run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
          "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=qpmesh-broker"])  # fmt: skip
    sans = ",".join(f"IP:{a}" if a[0].isdigit() or ":" in a else f"DNS:{a}" for a in addrs)
    ext.write_text(
        f"subjectAltName={sans}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    _run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
          "-CAcreateserial", "-out", str(crt), "-days", "30", "-extfile", str(ext)])  # fmt: skip
    return crt, key


def make_material(
    d: Path,
    addrs: Sequence[str],
    users: Sequence[str],
    *,
    prefix: str = "qpmesh/v1",
    agents: Mapping[str, tuple[str, Sequence[str]]] | None = None,
) -> Material:
    """Create CA, broker certificate for ``addrs``, passwords for ``users`` (plus the
    controller, the monitor and ``agents``' users) and the ACL in directory ``d``.

    Raises OSError (one line) if ``openssl`` or ``mosquitto_passwd`` is missing or fails.
    """
    d.mkdir(parents=True, exist_ok=True)
    ca = _make_ca(d, "qpmesh-ca")
    rogue, _ = _make_ca(d, "rogue-ca")
    crt, key = _make_server_cert(d, ca, addrs)
    every = list(dict.fromkeys([*users, CONTROLLER_USER, MONITOR_USER, *(agents or {})]))
    passwords = {u: secrets.token_urlsafe(18) for u in every}
    files: dict[str, Path] = {}
    (d / "users").mkdir(exist_ok=True)
    for u, pw in passwords.items():
        files[u] = d / "users" / f"{u}.password"
        _write_secret(files[u], pw + "\n")
    passwd = d / "passwd"
    _write_secret(passwd, "".join(f"{u}:{pw}\n" for u, pw in passwords.items()))
    _run(["mosquitto_passwd", "-U", str(passwd)])
    acl = d / "acl"
    acl.write_text(acl_text(prefix, agents=agents))
    return Material(d, ca[0], crt, key, passwd, acl, rogue, files)
