"""The example's charges the response decides, over real HTTP on two uvicorn workers
sharing Redis: a login counted by its failures, a completion stream that settles the
tokens it used, a websocket whose messages are limited."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from ratelimit_mw.socket_messages import CLOSE_REASON

from .conftest import FREE, StartServer

pytestmark = [pytest.mark.slow, pytest.mark.redis]


async def post_fresh(url: str, path: str, **kwargs: object) -> httpx.Response:
    """One request on a new connection (so that both workers get some)."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        return await client.post(path, **kwargs)  # type: ignore[arg-type]


async def test_only_failed_logins_count_across_two_workers(start_server: StartServer) -> None:
    """A free caller: six good logins never count; five wrong passwords for one
    username do, on either worker; then that username is refused (even with the right
    password) while another logs in."""
    server = start_server("redis", workers=2)

    async def login(username: str, password: str) -> int:
        response = await post_fresh(server.url, "/api/v1/login", headers=FREE,
                                    json={"username": username, "password": password})
        return response.status_code

    good = [await login("alice", "correct-horse") for _ in range(6)]
    wrong = [await login("alice", f"guess-{i}") for i in range(6)]
    assert good == [200] * 6
    assert wrong == [401] * 5 + [429]
    assert await login("alice", "correct-horse") == 429
    assert await login("bob", "correct-horse") == 200


async def test_a_completion_settles_the_tokens_its_stream_used(
    start_server: StartServer,
) -> None:
    """An anonymous caller has 2000 tokens a minute. A completion reserves 256, streams,
    and settles the 6000 it reported at the stream's end: the next one, on any worker,
    is refused until the debt has refilled."""
    server = start_server("redis", workers=2)
    words = " ".join(["w"] * 3000)
    first = await post_fresh(server.url, "/api/v1/completions",
                             json={"prompt": words, "max_tokens": 3000})
    assert first.status_code == 200
    assert first.headers["x-ratelimit-remaining-tokens"] == str(2000 - 256)
    assert '"total_tokens": 6000' in first.text
    assert first.text.endswith("data: [DONE]\n\n")
    refused = [await post_fresh(server.url, "/api/v1/completions", json={"prompt": "hi"})
               for _ in range(2)]
    assert [r.status_code for r in refused] == [429, 429]
    # About 4256 tokens of debt at 2000 a minute: two minutes and more.
    assert all(int(r.headers["retry-after"]) > 100 for r in refused)


async def test_websocket_messages_are_limited_per_connection(
    start_server: StartServer,
) -> None:
    """Ten messages a second per connection: the eleventh closes the socket with 1008."""
    server = start_server("redis", workers=2)
    address = server.url.replace("http://", "ws://") + "/ws/echo"
    async with connect(address, additional_headers=FREE) as websocket:
        for i in range(10):
            await websocket.send(f"m{i}")
            assert await asyncio.wait_for(websocket.recv(), 5) == f"m{i}"
        await websocket.send("one too many")
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(websocket.recv(), 5)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1008, CLOSE_REASON)


async def test_the_quota_endpoint_counts_the_tokens_settled(
    start_server: StartServer,
) -> None:
    """A free caller's completion of 2000 tokens: the quota endpoint reports the tier's
    tokens limit and what it counts, the settled cost (less what refilled since)."""
    server = start_server("redis", workers=2)
    words = " ".join(["w"] * 1000)
    async with httpx.AsyncClient(base_url=server.url, headers=FREE, timeout=10) as client:
        done = await client.post("/api/v1/completions",
                                 json={"prompt": words, "max_tokens": 1000})
        assert done.status_code == 200
        quota = (await client.get("/api/v1/account/quota")).json()
    assert quota["limits"]["tokens_per_minute"] == 10000
    # 10000 a minute refill 167 a second: a second or two of it at most.
    assert 2000 - 400 <= quota["usage"]["tokens_this_minute"] <= 2000


async def test_the_usage_history_counts_the_tokens_settled(
    start_server: StartServer,
) -> None:
    """Two completions (about 2000 and 20 tokens, each reserving 256): today's history
    bucket counts two requests and the tokens their streams reported."""
    server = start_server("redis", workers=2)
    prompts = [" ".join(["w"] * 1000), " ".join(["w"] * 10)]
    async with httpx.AsyncClient(base_url=server.url, headers=FREE, timeout=10) as client:
        for prompt in prompts:
            done = await client.post("/api/v1/completions",
                                     json={"prompt": prompt, "max_tokens": 1000})
            assert done.status_code == 200
        history = (await client.get("/api/v1/account/quota/history",
                                    params={"granularity": "hour"})).json()
    assert history["total"] == 2
    assert history["total_tokens"] == 2000 + 20
    assert sum(bucket["tokens"] for bucket in history["buckets"]) == 2000 + 20
