"""``python -m fd_platforms.cli``."""

import sys

from . import main

sys.exit(main())
