"""The API benchmark's clients, in their own process: ``python -m testbed.sim.api_bench_clients
URL TOKEN CLIENTS POLL_HZ [COMPRESS [NICE]]`` (NICE: raise its own nice value by that). Opens CLIENTS websockets (each reads every message;
COMPRESS 0 = without permessage-deflate, default 1 = offered as aiohttp does), then prints
``ready``; times ``GET URL/snapshot`` POLL_HZ times a second (0: never) until ``stop``
arrives on stdin, pausing between ``pause`` and ``resume`` (the benchmark runs the websockets
and the poller in two such processes, so a request's latency does not include the time its
process spends reading 20 websockets);
prints one JSON line: latencies (s), websocket messages and bytes received, errors, and the
websocket clients the API's ``/health`` counted at the end (``ws_clients``)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import aiohttp


async def _reader(ws: aiohttp.ClientWebSocketResponse, stats: dict[str, int]) -> None:
    async for msg in ws:
        if msg.type == aiohttp.WSMsgType.TEXT:
            stats["ws_messages"] += 1
            stats["ws_bytes"] += len(msg.data)
        elif msg.type == aiohttp.WSMsgType.ERROR:
            stats["errors"] += 1
            return


async def main(
    url: str, token: str, clients: int, poll_hz: float, compress: bool = True
) -> dict[str, Any]:
    """Run the clients until stdin says ``stop``; return the figures. ``pause`` / ``resume``
    stop and restart the polling (each answered ``ok``)."""
    stats = {"ws_messages": 0, "ws_bytes": 0, "errors": 0}
    lat: list[float] = []
    hdr = {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(headers=hdr, timeout=timeout) as http:
        socks = [
            await http.ws_connect(url + "ws", max_msg_size=0, compress=15 if compress else 0)
            for _ in range(clients)
        ]
        readers = [asyncio.create_task(_reader(ws, stats)) for ws in socks]
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        polling = poll_hz > 0
        period = 1.0 / poll_hz if poll_hz > 0 else 1.0
        command = loop.run_in_executor(None, sys.stdin.readline)
        while True:
            if command.done():
                line = command.result().strip()
                if line in ("stop", ""):
                    break
                polling = line == "resume" and poll_hz > 0
                print("ok", flush=True)
                command = loop.run_in_executor(None, sys.stdin.readline)
            if not polling:
                await asyncio.wait({command})
                continue
            t0 = time.perf_counter()
            try:
                async with http.get(url + "snapshot") as r:
                    await r.read()
                    if r.status == 200:
                        lat.append(time.perf_counter() - t0)
                    else:
                        stats["errors"] += 1
            except (aiohttp.ClientError, TimeoutError):
                stats["errors"] += 1
            await asyncio.sleep(max(0.0, period - (time.perf_counter() - t0)))
        try:
            async with http.get(url + "health") as r:
                stats["ws_clients"] = int((await r.json())["source"]["ws_clients"])
        except (aiohttp.ClientError, TimeoutError, KeyError, ValueError):
            stats["ws_clients"] = -1
            stats["errors"] += 1
        for ws in socks:
            await ws.close()
        for t in readers:
            t.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    return {**stats, "latencies_s": lat}


if __name__ == "__main__":
    url, token, n, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    deflate = len(sys.argv) < 6 or sys.argv[5] != "0"
    if len(sys.argv) > 6:
        os.nice(int(sys.argv[6]))
    print(json.dumps(asyncio.run(main(url, token, n, hz, deflate))), flush=True)
