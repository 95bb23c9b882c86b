"""``qpmesh keys``: make and inspect key files (docs/security.md), never printing key material.

- ``qpmesh keys gen probe --out F [--id ID] [--add-to OLD]``: a fresh 32-byte probe HMAC key
  (``--add-to``: the new file holds OLD's sending key too and keeps sending with it: step 1
  of a rotation);
- ``qpmesh keys gen action --out F --public P [--id ID]``: an Ed25519 signing key for the
  controller (F, mode 0600) and its verify key for the recovery agents (P, mode 0644);
- ``qpmesh keys show F [--json]``: the type, ids and sending key of a key file.

Files are created exclusively (an existing file is never overwritten: exit 2) with their mode
set at creation. Bad input (existing output, unreadable or malformed key file) exits 2 with
one line.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from contract.actionsig import new_private_seed, public_from_private
from contract.keys import (
    ED25519_PRIVATE,
    ED25519_PUBLIC,
    HMAC,
    KeyFileError,
    format_key_file,
    load_key_file,
)


def register(subparsers: Any) -> None:
    """Add ``keys gen`` and ``keys show`` to the root ``qpmesh`` parser."""
    p = subparsers.add_parser(
        "keys",
        help="generate and inspect key files (probe HMAC, action signing)",
        description="Generate and inspect qpmesh key files (docs/security.md). Key material "
        "is written only to the files, never printed.",
    )
    sub = p.add_subparsers(dest="keys_command", metavar="SUBCOMMAND", required=True)
    g = sub.add_parser("gen", help="generate a key file", description="Generate a key file.")
    g.add_argument("kind", choices=("probe", "action"),
                   help="probe: HMAC-SHA256 probe key; action: Ed25519 action signing key")  # fmt: skip
    g.add_argument("--out", required=True, metavar="FILE", help="the new (secret) key file, 0600")
    g.add_argument("--public", metavar="FILE",
                   help="action: the verify key file for the recovery agents (0644)")  # fmt: skip
    g.add_argument("--id", default="", help="key id (default: the UTC date and time)")
    g.add_argument("--add-to", metavar="OLD",
                   help="probe: also hold OLD's sending key and keep sending with it (rotation "
                   "step 1; step 2 is changing send to the new id)")  # fmt: skip
    g.add_argument("--json", action="store_true", help="print what was written as JSON")
    g.set_defaults(func=_gen)
    s = sub.add_parser("show", help="show a key file's type and key ids (never the keys)")
    s.add_argument("file", help="key file")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=_show)


def _write_new(path: Path, text: str, mode: int) -> None:
    """Create ``path`` with ``mode`` and write ``text``; raise ValueError if it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise ValueError(f"{path}: exists; not overwriting a key file") from None
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)  # the umask may have narrowed a public file's mode


def _gen(args: argparse.Namespace) -> int:
    kid = args.id or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = Path(args.out)
    written: dict[str, Any] = {"kind": args.kind, "id": kid}
    if args.kind == "probe":
        if args.public:
            raise ValueError("--public is only for action keys")
        keys = [(kid, HMAC, secrets.token_bytes(32))]
        send = ""
        if args.add_to:
            old = load_key_file(args.add_to, HMAC)
            if old.by_id(kid) is not None:
                raise KeyFileError(f"{args.add_to}: already has a key with id {kid!r}")
            keys.insert(0, (old.send_id, HMAC, old.send.material))
            send = old.send_id
        _write_new(out, format_key_file(keys, send), 0o600)
        written.update(file=str(out), ids=[k[0] for k in keys], send=send or kid)
    else:
        if args.add_to:
            raise ValueError("--add-to is only for probe keys")
        if not args.public:
            raise ValueError("action keys need --public FILE for the agents' verify key")
        seed = new_private_seed()
        pub = Path(args.public)
        if pub.exists():
            raise ValueError(f"{pub}: exists; not overwriting a key file")
        _write_new(out, format_key_file([(kid, ED25519_PRIVATE, seed)]), 0o600)
        _write_new(pub, format_key_file([(kid, ED25519_PUBLIC, public_from_private(seed))]),
                   0o644)  # fmt: skip
        written.update(file=str(out), public=str(pub), ids=[kid], send=kid)
    if args.json:
        print(json.dumps(written))
    else:
        extra = f" and {written['public']} (verify key)" if "public" in written else ""
        print(f"wrote {written['file']}{extra}: {args.kind} keys {', '.join(written['ids'])}, "
              f"sending with {written['send']}")  # fmt: skip
    return 0


def _show(args: argparse.Namespace) -> int:
    ks = load_key_file(args.file)
    doc = {"file": args.file, **ks.describe()}
    if args.json:
        print(json.dumps(doc))
    else:
        ids = ", ".join(k.id for k in ks.keys)
        print(f"{args.file}: {ks.type} keys {ids}, sending with {ks.send_id}")
    return 0
