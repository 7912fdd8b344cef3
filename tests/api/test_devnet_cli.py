"""``pulsarcast devnet`` (what ``make run`` starts) as a user meets it: a real process,
real HTTP, and a clean exit on SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.waiting import eventually


@contextlib.asynccontextmanager
async def _cli(*args: str, stop: signal.Signals) -> AsyncIterator[asyncio.subprocess.Process]:
    """``pulsarcast ARGS`` as a real process; at the end it must exit 0 on ``stop``. It is
    killed if the test fails first, so no process outlives the test."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pulsar.tools.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield process
        process.send_signal(stop)
        async with asyncio.timeout(30):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_devnet_serves_every_node_and_stops_cleanly(tmp_path: Path) -> None:
    async with _cli("devnet", "--nodes", "3", "--json", "--data-dir", str(tmp_path / "net"),
                    stop=signal.SIGINT) as process:
        assert process.stdout is not None
        nodes = []
        async with asyncio.timeout(60):
            while len(nodes) < 3:
                line = await process.stdout.readline()
                assert line, (await process.stderr.read()).decode()  # type: ignore[union-attr]
                nodes.append(json.loads(line))
        assert {"url", "token", "peer_id", "address", "data_dir"} <= set(nodes[0])
        first, last = nodes[0], nodes[2]
        async with aiohttp.ClientSession() as http:
            auth = {"Authorization": f"Bearer {first['token']}"}
            async with http.post(f"{first['url']}/v1/topics", json={"name": "cli"},
                                 headers=auth) as r:
                assert r.status == 201
                cid = (await r.json())["cid"]
            async with http.put(f"{last['url']}/v1/subscriptions/{cid}",
                                headers={"Authorization": f"Bearer {last['token']}"}) as r:
                assert r.status == 201
            async with http.post(f"{first['url']}/v1/topics/{cid}/events",
                                 json={"text": "hello"}, headers=auth) as r:
                assert r.status == 201
                event = (await r.json())["cid"]

            async def arrived() -> bool:
                async with http.get(f"{last['url']}/v1/topics/{cid}/events") as r:
                    return [e["cid"] for e in (await r.json())["events"]] == [event]

            await eventually(arrived, timeout=15)


async def test_node_command_reads_its_config_file_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\nport = 0\napi_port = 0\n')
    async with _cli("node", "--config", str(config), "--json", stop=signal.SIGTERM) as process:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            line = await process.stdout.readline()
        assert line, (await process.stderr.read()).decode()  # type: ignore[union-attr]
        info = json.loads(line)
        assert info["token"] == (tmp_path / "data" / "api-token").read_text().strip()
        async with aiohttp.ClientSession() as http, http.get(f"{info['url']}/v1/node") as r:
            assert (await r.json())["peer_id"] == info["peer_id"]


async def test_node_command_refuses_a_bad_config(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('data_dir = "x"\ncolour = "red"\n')
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pulsar.tools.cli", "node", "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await done.communicate()
    assert done.returncode != 0 and b"unknown settings ['colour']" in err


async def test_node_command_with_a_token_does_not_point_at_a_token_file(tmp_path: Path
                                                                        ) -> None:
    data = tmp_path / "data"
    async with _cli("node", "--data-dir", str(data), "--port", "0", "--api-port", "0",
                    "--token", "given-token-0123456789", stop=signal.SIGTERM) as process:
        assert process.stdout is not None
        lines = []
        async with asyncio.timeout(30):
            while not any(line.startswith("  token") for line in lines):
                line = (await process.stdout.readline()).decode()
                assert line, (await process.stderr.read()).decode()  # type: ignore[union-attr]
                lines.append(line)
    assert "  token given with --token (not stored)\n" in lines
    assert not (data / "api-token").exists()


@pytest.mark.parametrize(("flags", "message"), [
    (["--replicas", "0"], "replicas must be an integer in 1..20"),
    (["--replicas", "21"], "replicas must be an integer in 1..20"),
    (["--replicas", "2", "--min-acks", "3"], "min_acks (3) cannot exceed replicas (2)"),
])
def test_node_command_refuses_replicas_it_cannot_honour(
        tmp_path: Path, flags: list[str], message: str) -> None:
    from pulsar.tools.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["node", "--data-dir", str(tmp_path / "data"), *flags])
    assert message in str(stopped.value)
