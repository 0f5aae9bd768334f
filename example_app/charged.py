"""The example's routes whose charge the response decides: a login that counts only
failures, a completion that streams tokens and settles what it used, and a websocket
whose messages are limited (RATELIMIT_WEBSOCKET_* in tiers.toml)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

from ratelimit_mw import Limit, json_field, limit, spends

from .bodies import UNREADABLE_BODY, ErrorBody

router = APIRouter()

PASSWORD = "correct-horse"
"""Any username logs in with this password (it is a demo)."""

LOGIN_FAILURES = Limit("5/15 minutes", "fixed_window", name="login-failures",
                       count="failures", per=json_field("username"))
"""Five wrong passwords per username (and caller: the client IP without an API key) in
15 minutes; successes never count."""

COMPLETION_ESTIMATE = 256
"""Tokens reserved for a completion until its stream reports what it used."""


class Credentials(BaseModel):
    username: str = Field(max_length=200)
    password: str = Field(max_length=200)


@router.post("/api/v1/login", responses={
    **UNREADABLE_BODY, 401: {"model": ErrorBody, "description": "Wrong username or password."}})
@limit(LOGIN_FAILURES)
async def login(credentials: Credentials) -> Any:
    if credentials.password != PASSWORD:
        return JSONResponse({"error": "invalid_credentials",
                             "message": "Wrong username or password."}, status_code=401)
    return {"user": credentials.username, "token": f"demo-session-{credentials.username}"}


class CompletionRequest(BaseModel):
    prompt: str = Field(max_length=10_000)
    max_tokens: int = Field(64, ge=1, le=4096)


@router.post("/api/v1/completions", response_class=StreamingResponse, responses={
    **UNREADABLE_BODY, 200: {"content": {"text/event-stream": {}},
          "description": "Server-sent events: one per word, then the usage."}})
@spends("tokens", estimate=COMPLETION_ESTIMATE)
async def completions(body: CompletionRequest, request: Request) -> StreamingResponse:
    """A stand-in for a language model: echoes the prompt's words as events (up to
    ``max_tokens``), then reports the tokens it used, which the tier's tokens-per-minute
    limit settles when the stream ends."""
    words = body.prompt.split()[:body.max_tokens] or ["..."]
    prompt_tokens = len(body.prompt.split())

    async def events() -> AsyncIterator[bytes]:
        for word in words:
            yield f"data: {json.dumps({'text': word})}\n\n".encode()
            await asyncio.sleep(0)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                 "total_tokens": prompt_tokens + len(words)}
        request.state.tokens = usage["total_tokens"]  # what the stream cost, settled now
        yield f"data: {json.dumps({'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


@router.websocket("/ws/echo")
async def echo(websocket: WebSocket) -> None:
    """Echoes each text message; the messages are limited per connection and per
    caller (tiers.toml), past which the socket is closed with 1008."""
    await websocket.accept()
    try:
        while True:
            await websocket.send_text(await websocket.receive_text())
    except WebSocketDisconnect:
        pass
