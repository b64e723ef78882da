"""Commands run as on another host: an accelerator's device nodes in ``/dev``, no Paddle, pluggy 1.6.

:func:`host_command` wraps a command so that it runs

- where ``/dev`` also holds ``nodes`` (``("nvidia0",)``): a private mount namespace made by
  ``host_site/device_nodes.py``, which needs root; :func:`skip_without_namespaces` skips a test,
  with the reason, where the kernel refuses;
- with no Paddle (``paddle=False``): ``import paddle`` fails and no Paddle distribution is
  installed, in the command and in every process it starts (``host_site/sitecustomize.py``);
- registering plugins as pluggy 1.5 and 1.6 do (``pluggy_getattr=True``): ``getattr`` on every name
  in ``dir(plugin)``, so a property that imports runs.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

HOST_SITE = Path(__file__).resolve().parent / "host_site"
DEVICE_NODES = HOST_SITE / "device_nodes.py"


def host_command(
    command: Sequence[str], *, nodes: Sequence[str] = (), paddle: bool = True, pluggy_getattr: bool = False
) -> tuple[list[str], dict[str, str]]:
    """``command`` as that host runs it, and the environment variables to add for it."""
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(HOST_SITE), os.environ.get("PYTHONPATH")]))}
    if not paddle:
        env["FD_TEST_HIDE_PADDLE"] = "1"
    if pluggy_getattr:
        env["FD_TEST_PLUGGY_GETATTR"] = "1"
    prefix = [sys.executable, str(DEVICE_NODES), *nodes, "--"] if nodes else []
    return [*prefix, *command], env


@functools.cache
def namespaces_refused() -> str | None:
    """Why a private ``/dev`` cannot be made here (not root, or the kernel refuses), or None."""
    if os.geteuid() != 0:
        return "a private /dev needs root (a mount namespace); these tests run as another user"
    done = subprocess.run(
        [sys.executable, str(DEVICE_NODES), "nvidia0", "--", "true"], capture_output=True, text=True, timeout=60
    )
    return None if done.returncode == 0 else done.stderr.strip() or f"device_nodes.py exited {done.returncode}"


def skip_without_namespaces() -> None:
    """Skip the calling test, with the reason, where a private ``/dev`` cannot be made."""
    reason = namespaces_refused()
    if reason is not None:
        pytest.skip(reason)
