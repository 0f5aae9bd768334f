"""``python -m ratelimit_mw overrides …``: see ``ratelimit_mw.overrides.cli``."""

from __future__ import annotations

import sys


def main() -> int:
    if sys.argv[1:2] != ["overrides"]:
        print("usage: python -m ratelimit_mw overrides {list,get,set,delete,reset} ...",
              file=sys.stderr)
        return 2
    from .overrides.cli import main as overrides_main

    return overrides_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
