"""``python -m fd_platforms``: the ``fd-platforms`` command (:func:`fd_platforms.cli.main`)."""

import sys

from .cli import main

sys.exit(main())
