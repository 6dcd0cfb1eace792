"""python -m tools.benchmarks {models,scaling,memory,render} [options]"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main(argv: list[str]) -> int:
    commands = ("scaling",)
    if not argv or argv[0] not in commands:
        print(f"usage: python -m tools.benchmarks {{{','.join(commands)}}} [options]",
              file=sys.stderr)
        return 2
    if argv[0] == "scaling":
        from tools.benchmarks import scaling
        return scaling.main(argv[1:])
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
