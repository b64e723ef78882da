"""The conformance kit's pytest plugin: runs fd-platforms' suite against one installed platform.

Vendor teams run, in any folder where their plugin and fd-platforms are installed::

    pytest --fd-platform NAME      # the suite, with pytest's full output
    fd-platforms check NAME        # the same suite as a platform x check matrix (--all, --json)

Registered under the ``pytest11`` entry point, so every pytest session of an environment that has fd-platforms
loads it: it adds its options and the ``fd_hooks`` marker and imports nothing else. Given ``--fd-platform``, it
registers :mod:`fd_platforms.conformance.fixtures`, which adds the suite (:mod:`fd_platforms.conformance.suite`, one
module per check in :data:`~fd_platforms.conformance.CHECKS`) to the run and gives its tests their fixtures.
"""

from __future__ import annotations

import pytest

HOOKS_MARKER = "fd_hooks"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fd-platforms", "fd-platforms conformance kit")
    group.addoption(
        "--fd-platform", metavar="NAME", help="run the fd-platforms conformance suite against installed platform NAME"
    )
    group.addoption("--fd-platform-report", metavar="FILE", help="also write each suite test's outcome to FILE as JSON")
    group.addoption(
        "--fd-platform-rule",
        metavar="VERSION",
        default=None,
        help="the create-or-attach rule version the engine pins (default: the core's default version)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{HOOKS_MARKER}(*names): the fd-platforms hooks a conformance test exercises")
    name = config.getoption("fd_platform")
    if not name:
        return  # inert: nothing of fd-platforms imported
    from . import fixtures

    config.pluginmanager.register(fixtures, "fd_platforms.conformance.fixtures")
    fixtures.configure(config, str(name))
