"""``python -m ratelimit_mw overrides …``: the admin API's operations from a shell,
straight against a storage URL (the workers pick the changes up as from the API)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import sys
from collections.abc import Sequence

from ..errors import ConfigError, StorageError
from ..storage import storage_from_url
from .admin import override_from_body
from .model import OverrideError, caller_key
from .view import Overrides

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ratelimit_mw overrides",
                                     description="List, set and delete rate-limit overrides.")
    parser.add_argument("--url", default=os.environ.get("RATELIMIT_STORAGE_URL"),
                        help="storage URL (default: $RATELIMIT_STORAGE_URL)")
    parser.add_argument("--prefix", default=os.environ.get("RATELIMIT_STORAGE_PREFIX",
                                                           "ratelimit:"))
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="every override, one JSON object a line")
    for name, text in (("get", "one caller's override"), ("delete", "remove an override"),
                       ("reset", "forget a caller's counters")):
        commands.add_parser(name, help=text).add_argument(
            "caller", help="api_key:SECRET, user:ID, ip:ADDRESS, network:CIDR or key:KEY")
    setting = commands.add_parser("set", help="set an override from a JSON body, as PUT takes")
    setting.add_argument("body", help='e.g. \'{"caller": "api_key:k", "block_for": 3600}\'')
    return parser


async def _run(args: argparse.Namespace) -> int:
    overrides = Overrides.from_url(args.url, prefix=args.prefix)
    who = f"cli:{getpass.getuser()}"
    try:
        if args.command == "list":
            for item in await overrides.all():
                print(item.to_json())
            return 0
        if args.command == "set":
            try:
                data = json.loads(args.body)
            except ValueError:
                raise OverrideError("body", "not valid JSON") from None
            override = override_from_body(data, now=overrides.clock(), by=who)
            await overrides.set(override, by=who)
            print(override.to_json())
            return 0
        caller = caller_key(args.caller)
        if args.command == "get":
            found = await overrides.get(caller)
        elif args.command == "delete":
            found = await overrides.delete(caller, by=who)
        else:
            storage = storage_from_url(args.url, prefix=args.prefix)
            try:
                await overrides.reset(caller, lambda: storage.reset(caller), by=who)
            finally:
                await storage.close()
            print(json.dumps({"reset": caller}))
            return 0
        if found is None:
            print(f"no override for {caller}", file=sys.stderr)
            return 1
        print(found.to_json())
        return 0
    finally:
        await overrides.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; the exit status (2: bad input, 3: storage unreachable)."""
    args = _parser().parse_args(argv)
    if not args.url or args.url.lower().startswith("memory:"):
        print("give a Redis --url (or set RATELIMIT_STORAGE_URL): memory:// overrides live "
              "inside the app's own process", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(args))
    except (OverrideError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
