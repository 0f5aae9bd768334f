"""A real uvicorn server in a thread of the test process, on a free loopback port."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn

from tests.conftest import free_port


@contextmanager
def serve(app: Any, **config: Any) -> Iterator[str]:
    """Run ``app`` under uvicorn until the block ends; yields its base URL. On h11
    unless ``http`` says otherwise (the subprocess servers take uvicorn's default)."""
    port = free_port()
    options: dict[str, Any] = {"log_level": "warning", "ws": "none", "lifespan": "on",
                               "http": "h11", **config}
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
