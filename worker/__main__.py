"""``python -m worker``: the Temporal worker, same as ``rollbackctl worker``."""

import sys

from worker.cli import main

sys.exit(main(["worker", *sys.argv[1:]]))
