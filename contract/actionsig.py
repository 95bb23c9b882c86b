"""Signed remediation actions: the controller signs, the recovery agents verify (Ed25519).

A signed action is the `contract.remediation.ActionDoc` JSON object plus one ``sig`` member::

    {"id": ..., "kind": ..., ..., "expires_at_ns": ...,
     "sig": {"alg": "ed25519", "key": "<key id>", "value": "<base64 of 64 bytes>"}}

The signature covers ``b"qpmesh-action-v1\\n"`` + the action's canonical JSON (its `to_dict`,
keys sorted, no spaces), so every field a receiver acts on (kind, NIC or link, job, id and
``expires_at_ns``) is signed, and a receiver that does not know ``sig`` still decodes the
action (`ActionDoc.decode` ignores unknown keys). Only the controller holds the private key
(`contract.keys` ``ed25519-private``); agents hold the public one (``ed25519-public``), so an
agent, or anyone who read an agent's key file, cannot forge an action.

`ActionSigner` signs (`sign` returns the payload to publish); `verify_action` checks a payload
against a verify `KeySet` and returns the action or raises `ActionAuthError` (a
`DocumentError`: one line, ``reason`` a short counter key: ``unsigned``, ``unknown_key``,
``bad_signature``). Replays (the same id again, an expired action) are the receiver's
business: `recovery.trust.ActionGate` remembers ids until they expire.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from contract.jsondoc import DocumentError, decode_object
from contract.keys import ED25519_PRIVATE, ED25519_PUBLIC, KeySet
from contract.remediation import ActionDoc

ALG = "ed25519"
DOMAIN = b"qpmesh-action-v1\n"
SIG = "sig"


class ActionAuthError(DocumentError):
    """A remediation action is not signed by a key the receiver trusts (``reason``: counter)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"remediation action: {message}")
        self.reason = reason


def signed_bytes(doc: ActionDoc) -> bytes:
    """Return the bytes a signature of ``doc`` covers (domain tag + canonical JSON)."""
    body = json.dumps(doc.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return DOMAIN + body.encode()


class ActionSigner:
    """Signs actions with the ``send`` key of an ``ed25519-private`` `KeySet`."""

    def __init__(self, keys: KeySet) -> None:
        if keys.type != ED25519_PRIVATE:
            raise ValueError(f"{keys.source}: a signing key must be {ED25519_PRIVATE}")
        self.key_id = keys.send_id
        self._key = Ed25519PrivateKey.from_private_bytes(keys.send.material)

    def __repr__(self) -> str:
        return f"ActionSigner(key_id={self.key_id!r})"

    def sign(self, doc: ActionDoc) -> bytes:
        """Return the signed JSON payload of ``doc``."""
        sig = self._key.sign(signed_bytes(doc))
        out: dict[str, Any] = doc.to_dict()
        out[SIG] = {"alg": ALG, "key": self.key_id, "value": base64.b64encode(sig).decode()}
        return json.dumps(out, separators=(",", ":")).encode()

    def public_key(self) -> bytes:
        """Return the 32-byte public key that verifies this signer's actions."""
        from cryptography.hazmat.primitives import serialization

        return self._key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )


def public_from_private(seed: bytes) -> bytes:
    """Return the 32-byte Ed25519 public key of a 32-byte private seed."""
    from cryptography.hazmat.primitives import serialization

    return (
        Ed25519PrivateKey.from_private_bytes(seed)
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )


def new_private_seed() -> bytes:
    """Return a fresh random 32-byte Ed25519 private seed."""
    from cryptography.hazmat.primitives import serialization

    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def verify_action(payload: bytes | bytearray, keys: KeySet) -> ActionDoc:
    """Return the action in ``payload`` if a key of ``keys`` (``ed25519-public``) signed it.

    Raises `ActionAuthError` (unsigned, unknown key, bad signature) or `DocumentError` (the
    action itself is malformed).
    """
    if keys.type != ED25519_PUBLIC:
        raise ValueError(f"{keys.source}: a verify key must be {ED25519_PUBLIC}")
    doc = ActionDoc.decode(payload)
    sig = decode_object(payload, "remediation action").get(SIG)
    if sig is None:
        raise ActionAuthError("unsigned", f"{doc.id} is not signed")
    if not isinstance(sig, dict) or sig.get("alg") != ALG:
        raise ActionAuthError("bad_signature", f"{doc.id}: sig must be an {ALG} signature")
    key = keys.by_id(str(sig.get("key", "")))
    if key is None:
        raise ActionAuthError("unknown_key", f"{doc.id}: signed by an unknown key")
    try:
        raw = base64.b64decode(str(sig.get("value", "")), validate=True)
        Ed25519PublicKey.from_public_bytes(key.material).verify(raw, signed_bytes(doc))
    except (InvalidSignature, binascii.Error, ValueError):
        raise ActionAuthError("bad_signature", f"{doc.id}: bad signature") from None
    return doc
