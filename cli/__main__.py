"""``python -m cli``: same as ``rollbackctl``."""

from cli.main import entry

entry()
