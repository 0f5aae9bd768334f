"""The bodies of the example's own errors, and the responses its routes document."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorBody(BaseModel):
    """The body of the example's own errors: the shape of every answer of ratelimit_mw."""

    error: str
    message: str


class FastAPIError(BaseModel):
    """FastAPI's own error body."""

    detail: str


UNKNOWN_KEY: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "The X-API-Key is not one of the demo keys."}}
UNREADABLE_BODY: dict[int | str, dict[str, Any]] = {
    400: {"model": FastAPIError, "description": "The body can't be read (FastAPI's answer)."}}
