"""``python -m perf`` is ``python -m perf.run``."""

import sys

from perf.run import main

sys.exit(main())
