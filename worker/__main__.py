"""``python -m worker``: the Temporal worker alone, with the same flags as ``rollbackctl worker``.

The scenarios start the worker this way (as a child process a step can SIGKILL) without
importing the command line.
"""

import argparse
import sys

from worker import telemetry
from worker.config import WorkerConfig
from worker.flags import ConfigError, add_kube_flags, add_temporal_flags, add_worker_flags
from worker.process import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__)
    add_temporal_flags(parser)
    add_kube_flags(parser)
    add_worker_flags(parser)
    parser.add_argument("--log-format", choices=["text", "json"], default=None)
    args = parser.parse_args(argv)
    telemetry.configure_logging(args.log_format)
    try:
        config = WorkerConfig.from_args(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run(worker=config)
    return 0


sys.exit(main())
