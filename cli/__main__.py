"""``python -m cli``: same as ``rollbackctl``."""

import sys

from cli.main import main

sys.exit(main())
