"""``qpmesh tui`` (the live mesh grid) and ``qpmesh tui bench``.

``qpmesh demo`` (the simulator under the grid) is the testbed's: `testbed.demo_cli`.
"""

from __future__ import annotations

import argparse
import json
import ssl
from typing import Any


class TuiError(ValueError):
    """Bad ``qpmesh tui`` arguments."""


def register(subparsers: Any) -> None:
    """Add the ``tui`` subcommand (and ``tui bench``) to the root parser."""
    p = subparsers.add_parser(
        "tui",
        help="live mesh grid of a controller (--api URL --token T), or --fake",
        description="The live mesh grid of a running controller, through its HTTP API and "
        "websocket (--api, --token), or of a seeded example (--fake). Keys: arrows/hjkl move, "
        "Enter/click select, / filter, m mode, a inbound/outbound, w window, c Control, q quit. "
        "Exit 2: bad URL or the token is refused; exit 1: the controller cannot be reached.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--api",
        metavar="URL",
        help="the controller's API, http://HOST:PORT or https://HOST:PORT (as served by "
        "'qpmesh controller' [api] listen or 'qpmesh demo --serve'); reconnects when it goes away",
    )
    src.add_argument("--fake", action="store_true", help="show a seeded example fabric")
    p.add_argument("--token", help="the API bearer token (operator or tenant) with --api")
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="read the bearer token from FILE (first line) instead of --token",
    )
    p.add_argument("--ca", metavar="FILE", help="with an https --api: the CA that signed it")
    p.add_argument("--cert", metavar="FILE", help="a client certificate (PEM) for mutual TLS")
    p.add_argument("--key", metavar="FILE", help="the key of --cert (PEM)")
    p.add_argument("--nics", type=int, default=32, help="NICs of the --fake fabric (default 32)")
    p.add_argument("--seed", type=int, default=1, help="seed of the --fake source")
    p.add_argument(
        "--threshold-us",
        type=float,
        default=5.0,
        help="probe delay threshold in µs (default %(default)s)",
    )
    p.add_argument("--interval", type=float, default=0.5, help="refresh period s (default 0.5)")
    p.set_defaults(func=_tui)
    tsub = p.add_subparsers(dest="tui_command", metavar="SUBCOMMAND")
    b = tsub.add_parser("bench", help="frame render time for a large grid vs a small one")
    b.add_argument("--nics", type=int, default=1024, help="NICs (default %(default)s)")
    b.add_argument("--baseline-nics", type=int, default=64, help="baseline NICs (default 64)")
    b.add_argument("--frames", type=int, default=40, help="frames to time (default 40)")
    b.add_argument("--width", type=int, default=160, help="grid width in columns (default 160)")
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=_bench)


def _tui(args: argparse.Namespace) -> int:
    from mesh.fabric import FabricShape, build_fabric
    from tui.app import MeshApp
    from tui.fake import FakeSource

    if args.api is not None:
        return _remote(args)
    if not args.fake:
        raise TuiError(
            "say where the mesh comes from: --api http://HOST:PORT --token T (a running "
            "controller), or --fake; 'qpmesh demo' runs a simulated one"
        )
    fabric = build_fabric(
        FabricShape.for_nics(args.nics, nics_per_leaf=8 if args.nics <= 64 else 32)
    )
    source = FakeSource(fabric, seed=args.seed)
    MeshApp(
        source,
        interval_s=args.interval,
        threshold_ns=args.threshold_us * 1e3,
        on_tick=lambda: source.advance(args.interval),
    ).run()
    return 0


def _token(args: argparse.Namespace) -> str:
    if args.token is not None and args.token_file is not None:
        raise TuiError("give --token or --token-file, not both")
    if args.token_file is not None:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                tok = f.readline().strip()
        except OSError as exc:
            raise TuiError(f"--token-file: cannot read {args.token_file}: {exc.strerror}") from None
        if not tok:
            raise TuiError(f"--token-file: {args.token_file} has no token on its first line")
        return tok
    if not args.token:
        raise TuiError("--api needs --token T or --token-file FILE")
    return str(args.token)


def client_tls(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """Return the TLS context of ``--ca``/``--cert``/``--key`` (None when none is given);
    raise `TuiError` (one line) for a file that cannot be read or does not fit."""
    if ca is None and cert is None and key is None:
        return None
    if (cert is None) != (key is None):
        raise TuiError("--cert and --key go together")
    try:
        ctx = ssl.create_default_context(cafile=ca)
        if cert is not None and key is not None:
            ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:  # a certificate or key that does not load or fit
        raise TuiError(f"TLS files: {exc.reason or exc}") from None
    except OSError as exc:
        raise TuiError(f"TLS files: cannot read {exc.filename}: {exc.strerror}") from None
    return ctx


def _remote(args: argparse.Namespace) -> int:
    """``qpmesh tui --api URL --token T``: connect first (errors exit 2/1), then the screen."""
    from tui.apiclient import ApiSource
    from tui.app import MeshApp

    tls = client_tls(args.ca, args.cert, args.key)
    source = ApiSource(args.api, _token(args), ssl_context=tls)  # ValueError: bad URL (exit 2)
    source.start()  # ApiTokenRefused (exit 2), ApiUnreachable (exit 1)
    try:
        app = MeshApp(source, interval_s=args.interval, threshold_ns=args.threshold_us * 1e3)
        app.sub_title = f"controller {source.base}"
        app.run()
    finally:
        source.close()
    return 0


def _bench(args: argparse.Namespace) -> int:
    from tui.bench import bench

    result = bench(args.nics, args.baseline_nics, frames=args.frames, width=args.width)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0
