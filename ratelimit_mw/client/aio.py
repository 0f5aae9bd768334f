"""asyncio, imported by the first asynchronous call that needs it: a program that only
makes synchronous calls starts without loading it."""

from __future__ import annotations


async def sleep(delay: float) -> None:
    """``asyncio.sleep(delay)``."""
    import asyncio

    await asyncio.sleep(delay)
