"""Count the commands clients send to Redis (not those a Lua script runs), by MONITOR."""

from __future__ import annotations

import threading
import time
from collections import Counter
from types import TracebackType

import redis

_STOP = "bench-monitor-stop"


class ClientCommands:
    """``with ClientCommands(url) as sent: ...``; then ``sent.counts`` holds, per command
    name, the commands clients sent meanwhile (MONITOR tells them from the commands
    scripts run; its own and connection set-up commands are left out)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.counts: Counter[str] = Counter()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> ClientCommands:
        self._thread.start()
        self._ready.wait(10)
        time.sleep(0.2)  # MONITOR is on before the first counted command
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            client.echo(_STOP)
        finally:
            client.close()
        self._thread.join(10)

    def _watch(self) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            with client.monitor() as monitor:
                self._ready.set()
                while True:
                    command = monitor.next_command()
                    text = str(command["command"])
                    if text == f"ECHO {_STOP}":
                        return
                    name = text.split(" ", 1)[0].lower()
                    if command.get("client_type") != "lua" and name not in (
                            "info", "echo", "hello", "client"):
                        self.counts[name] += 1
        finally:
            client.close()
