"""An unselected plugin that ends its process (``os._exit`` or SIGKILL, in its import or its detection) ends only
the screening child (``fd_platforms.loading.screening``): ``list`` shows it as a broken row saying how it ended,
and ``plan`` and ``run`` go on with the platform selected without it."""

from __future__ import annotations

import json

import pytest
from run_helpers import QWEN, console_script

ENDS_ITS_PROCESS = {
    "exit-in-import": "import os\nos._exit(3)\n",
    "sigkill-in-import": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "exit-in-detection": """
import os
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, PlatformIdentity

@hookimpl
def platform_identity():
    return PlatformIdentity("ender", "ender_dev", None)

@hookimpl
def detect_platform():
    os._exit(7)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"
""",
}


ENDED = {
    "exit-in-import": "it exited with code 3",
    "sigkill-in-import": "it was killed by SIGKILL",
    "exit-in-detection": "it exited with code 7",
}


@pytest.mark.slow
@pytest.mark.parametrize("how", list(ENDS_ITS_PROCESS))
def test_a_plugin_ending_its_process_is_a_broken_row_and_plan_and_run_go_on(make_plugin, how: str) -> None:
    site = make_plugin("ender", source=ENDS_ITS_PROCESS[how])
    listed = console_script("list", "--json", PYTHONPATH=str(site))  # the console script: a regression ends its process
    assert listed.returncode == 0, listed.stderr
    payload = json.loads(listed.stdout)
    [row] = [row for row in payload["platforms"] if row["name"] == "ender"]
    assert row["status"] == "broken" and ENDED[how] in row["reason"] and "uninstall fd-test-ender" in row["reason"]
    assert payload["selected"]["name"] == "cpu"
    for command in (
        ("plan", "--model", QWEN, "--device-memory", "1GiB"),
        ("run", "--model", QWEN, "--device-memory", "256MiB"),
    ):
        done = console_script(*command, PYTHONPATH=str(site))
        assert done.returncode == 0, done.stderr
        assert "skipping broken platform plugin: platform plugin 'ender'" in done.stderr
