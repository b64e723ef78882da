"""What ``run``'s fork server imports once, before it forks any child (``FD_PLATFORMS_START_METHOD=forkserver``,
:data:`~fd_platforms.lifecycle.children.START_METHOD_ENV`): Paddle, the core's way (quiet, the process's
signal handlers kept), and the children's own modules. Importing this module is its whole job."""

from __future__ import annotations

from ..contract.paddle_import import import_paddle, paddle_installed
from . import manager, worker  # noqa: F401 - imported for the children forked after

if paddle_installed():  # without it each child reports the missing Paddle itself, as a spawned one does
    import_paddle()
