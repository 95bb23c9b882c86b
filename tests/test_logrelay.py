"""Python ``logging`` records as JSON lines (issue 33 item 7): the relay itself, and the
controller process relaying its own records (aiomqtt's, aiohttp's, asyncio's) into its log."""

from __future__ import annotations

import asyncio
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import pytest

from controller.logrelay import relay_logging
from qpmesh.cli import build_parser


def test_a_record_with_its_traceback_is_one_value_and_the_root_logger_is_restored() -> None:
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    shown = warnings.showwarning
    got: list[tuple[str, str, str]] = []
    with relay_logging(lambda *rec: got.append(rec)) as handler:
        assert root.handlers == [handler]
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logging.getLogger("aiohttp.server").exception("Error handling request")
        logging.getLogger("x").debug("below the level: dropped")
        with warnings.catch_warnings():  # the tests make warnings errors: shown here
            warnings.simplefilter("always")
            warnings.warn("a warning travels too", UserWarning, stacklevel=1)
    assert root.handlers == before and root.level == level and warnings.showwarning is shown
    (level_, name, text), (wlevel, wname, wtext) = got
    assert (level_, name) == ("ERROR", "aiohttp.server")
    assert text.startswith("Error handling request\nTraceback") and "boom" in text
    assert (wlevel, wname) == ("WARNING", "py.warnings") and "a warning travels too" in wtext
    logging.getLogger("x").error("after: not relayed")
    assert len(got) == 2


async def _fake_service(*_: Any, **__: Any) -> None:
    """What a library does inside the service: a logging record, an unretrieved failure."""

    async def fail() -> None:
        raise RuntimeError("nobody awaited me")

    logging.getLogger("aiomqtt").warning("connection dropped")
    task = asyncio.get_running_loop().create_task(fail())
    await asyncio.sleep(0)
    del task  # asyncio logs "Task exception was never retrieved" when it is collected


def test_the_controller_process_writes_its_logging_records_as_json_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    import gc

    import controller.service

    monkeypatch.setattr(controller.service, "run_service", _fake_service)
    log = tmp_path / "c.jsonl"
    args = build_parser().parse_args(["controller", "--broker", "mqtt://127.0.0.1:1883",
                                      "--log", str(log)])  # fmt: skip
    assert args.func(args) == 0
    gc.collect()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    relayed = [x for x in lines if x["msg"] == "python log"]
    assert {(x["level"], x["logger"]) for x in relayed} >= {("WARNING", "aiomqtt"),
                                                             ("ERROR", "asyncio")}  # fmt: skip
    (failed,) = [x for x in relayed if x["logger"] == "asyncio"]
    assert "never retrieved" in failed["detail"] and "nobody awaited me" in failed["detail"]
    assert "Traceback" not in capfd.readouterr().err  # nothing in plain text


def test_a_request_aiohttp_cannot_parse_is_one_warning_line_without_its_bytes() -> None:
    import socket

    from aiohttp import web

    from controller.api.server import ApiThread

    got: list[tuple[str, str, str]] = []
    srv = ApiThread(web.Application(), "127.0.0.1", 0)
    with relay_logging(lambda *rec: got.append(rec)):
        port = srv.start()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sk:
                sk.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Secret: hunter2-token\x00\r\n\r\n")
                assert sk.recv(4096).split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
        finally:
            srv.stop()
    (rec,) = [r for r in got if r[1] == "aiohttp.server"]
    level, _, text = rec
    assert level == "WARNING" and "\n" not in text and "Traceback" not in text
    assert text.startswith("Error handling request from 127.0.0.1: 400 ")
    assert "hunter2" not in text
