"""``python -m tsanalysis ...`` — the same as the ``tsanalysis`` console script."""

import sys

from .cli import main

sys.exit(main())
