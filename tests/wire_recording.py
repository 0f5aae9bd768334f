"""What a Redis storage writes on its connections, as the tests see it: each write of
the transport, and the names of the commands in it (the pipeline writes each flush at
once, so one write is one flush)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Connection

from ratelimit_mw import RedisStorage

__all__ = ["Writes", "command_names", "recording_storage"]


class Writes(list[bytes]):
    """The bytes of each write, in order, after the connection's set-up."""

    def commands(self) -> list[bytes]:
        """The name of every command written, in order."""
        return [name for data in self for name in command_names(data)]

    def flushes(self) -> list[list[bytes]]:
        """The command names of each write."""
        return [command_names(data) for data in self]


def command_names(packed: bytes) -> list[bytes]:
    """The name of each command in RESP ``packed`` (arguments without CR LF)."""
    tokens, names, i = packed.split(b"\r\n"), [], 0
    while i < len(tokens) - 1:
        names.append(tokens[i + 2])
        i += 1 + 2 * int(tokens[i][1:])
    return names


def recording_storage(url: str, writes: Writes, **options: Any) -> RedisStorage:
    """``RedisStorage.from_url(url, **options)`` whose connections append what they
    write to ``writes`` once they are set up (the pipeline's included)."""

    class Recording(Connection):
        async def connect(self) -> None:  # type: ignore[override]
            await super().connect()
            writer = self._writer
            if writer is not None and not isinstance(writer.transport, _Recorder):
                writer._transport = _Recorder(writer.transport, writes)  # type: ignore[attr-defined]

    return RedisStorage.from_url(url, connection_class=Recording, **options)


class _Recorder:
    """A transport that records each write and hands everything to the real one."""

    def __init__(self, inner: Any, writes: Writes) -> None:
        self._inner = inner
        self._writes = writes

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._writes.append(bytes(data))
        self._inner.write(data)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
