"""What the commands write: an error is one line and never a traceback, a stdout that cannot take the output is
one line too, what a plugin prints or closes cannot corrupt the output or steer selection, and control characters
from a config or a plugin never reach the terminal raw.

A plugin that closes descriptor 1 and a stdout on ``/dev/full`` are the process's own: those run the console script.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from run_helpers import QWEN, ROOT, SCRIPT, clean_env, console_script
from run_helpers import main_in_process as cli

QWEN_CONFIG = ROOT / QWEN / "config.json"


def test_no_traceback_even_for_an_unexpected_error(monkeypatch) -> None:
    """The CLI's last line of defence: one line, and the traceback only with -v."""
    import fd_platforms.cli.list_command as c

    def boom(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(c, "run", boom)
    done = cli("list")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "fd-platforms: internal error: ZeroDivisionError: a bug. This is a bug in fd-platforms; "
        "rerun with -v for the traceback and report it"
    )
    verbose = cli("-v", "list")
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr


@pytest.mark.parametrize(
    "command",
    [
        ("list",),
        ("list", "--json"),
        ("plan", "--model", QWEN, "--device-memory", "1GiB"),
        ("plan", "--model", QWEN, "--device-memory", "1GiB", "--json"),
    ],
    ids=" ".join,
)
@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_full_stdout_is_one_line_and_exit_1(command: tuple[str, ...]) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [SCRIPT, *command], stdout=full, stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=ROOT, timeout=120
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        (
            "fd-platforms: error: cannot write the output to stdout: No space left on device. "
            "Fix: free space where stdout goes (a full disk, /dev/full), or send it elsewhere"
        )
    ]


# -- control characters from a config or a plugin are escaped ---------------------------------------

EVIL = "evil\x1b[2J\x1b]0;pwned\x07\rname\u202e"


@pytest.mark.slow
def test_a_models_name_with_control_characters_is_escaped(tmp_path: Path) -> None:
    config = json.loads(QWEN_CONFIG.read_text())
    config["_name_or_path"] = EVIL
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    for command, runner in ((("plan",), cli), (("run",), console_script)):
        done = runner(*command, "--model", str(tmp_path / "model"), "--device-memory", "256MiB")
        assert done.returncode == 0, done.stderr
        assert "evil\\x1b[2J\\x1b]0;pwned\\x07\\rname\\u202e" in done.stdout
        assert not any(c in done.stdout + done.stderr for c in "\x1b\x07\r\u202e")


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_plugins_reason_with_control_characters_is_escaped(make_plugin) -> None:
    make_plugin("shady", available=False, reason=EVIL)
    for command in (("list",), ("plan", "--platform", "shady", "--model", QWEN)):
        done = cli(*command)
        assert "evil\\x1b[2J" in done.stdout + done.stderr, done.stderr
        assert not any(c in done.stdout + done.stderr for c in "\x1b\x07\r\u202e")


# -- a plugin cannot corrupt the output or steer selection ------------------------------------------

NOISY = """
import os, sys
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, PlatformIdentity
print("noise from import", flush=True)
os.environ["FD_PLATFORM"] = "noisy"  # steering selection from an import

@hookimpl
def platform_identity():
    return PlatformIdentity("noisy", "noisy_dev", None)

@hookimpl
def detect_platform():
    print("noise from detection", flush=True)
    os.write(1, b"raw noise on descriptor 1\\n")
    return Detection(False, "never here", 0)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"
"""


@pytest.mark.parametrize(
    "command", [("list", "--json"), ("plan", "--model", QWEN, "--device-memory", "1GiB", "--json")], ids=lambda c: c[0]
)
@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_plugin_printing_cannot_corrupt_json_or_steer_selection(make_plugin, command: tuple[str, ...]) -> None:
    make_plugin("noisy", source=NOISY)
    done = cli(*command)  # what the plugins print on descriptors 1 and 2 is in done.stderr, as from the console script
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)  # the whole of stdout is the JSON
    assert "noise from import" in done.stderr and "raw noise on descriptor 1" in done.stderr
    selected = payload["selected"]["name"] if command[0] == "list" else payload["platform"]
    assert selected == "cpu", "FD_PLATFORM set by a plugin's import changed nothing"


CLOSES_STDOUT = """
import os
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, PlatformIdentity

@hookimpl
def platform_identity():
    return PlatformIdentity("closer", "closer_dev", None)

@hookimpl
def detect_platform():
    os.close(1)
    return Detection(False, "never here", 0)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"
"""


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_plugin_closing_stdout_is_blamed_by_name_and_the_output_survives(make_plugin) -> None:
    site = make_plugin("closer", source=CLOSES_STDOUT)
    done = console_script("list", "--json", PYTHONPATH=str(site))
    assert done.returncode == 0, done.stderr
    [row] = [row for row in json.loads(done.stdout)["platforms"] if row["name"] == "closer"]
    assert row["status"] == "broken"
    assert "closed the process's stdout" in row["reason"] and "Fix: never close file descriptors" in row["reason"]


CLOSES_STDOUT_SLOWLY = CLOSES_STDOUT.replace(
    "    os.close(1)\n",
    "    os.close(1)\n    import time\n    time.sleep(1.0)  # the opener takes number 1 meanwhile\n",
)


OPENS_A_FILE = """
import time
from typing import BinaryIO
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, PlatformIdentity

@hookimpl
def platform_identity():
    return PlatformIdentity("opener", "opener_dev", None)

@hookimpl
def detect_platform():
    time.sleep(0.3)  # after the closer closed descriptor 1, before it returns
    with open(__file__, "rb"):  # the lowest free number: 1, while the closer runs
        time.sleep(1.5)
    return Detection(False, "opened a file", 0)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"
"""


@pytest.mark.slow
def test_a_closed_stdout_is_blamed_on_the_closer_though_another_plugin_took_its_number(make_plugin) -> None:
    """Detections run together: the closer's number 1 is taken by the opener's file before the closer's
    check; the closer is still blamed (the file changed) and the opener, which overlapped, is not."""
    make_plugin("closer", source=CLOSES_STDOUT_SLOWLY)
    site = make_plugin("opener", source=OPENS_A_FILE)
    done = console_script("list", "--json", PYTHONPATH=str(site))
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)["platforms"]}
    assert rows["closer"]["status"] == "broken"
    assert "closed the process's stdout" in rows["closer"]["reason"], rows["closer"]["reason"]
    assert "beside" not in rows["closer"]["reason"]  # detected alone, the blame is certain
    assert rows["opener"]["status"] == "unavailable" and rows["opener"]["reason"] == "opened a file"
