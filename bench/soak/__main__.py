"""``python -m bench.soak [N] [--in-place]``: one soak, its report, exit 1 unless every
invariant is 0."""

import asyncio
import signal
import sys

from bench.soak.script import report, soak


def main() -> int:
    """One soak of N workloads (default 1,000), its report."""
    args = [a for a in sys.argv[1:] if a != "--in-place"]
    count = int(args[0]) if args else 1000
    result = asyncio.run(soak(count, in_place="--in-place" in sys.argv[1:]))
    print("\n".join(report(result)))
    return 0 if result.passed else 1


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
