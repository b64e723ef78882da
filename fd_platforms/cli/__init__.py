"""The ``fd-platforms`` command: ``list`` platforms, ``plan`` KV cache blocks, ``run`` the lifecycle, ``check``
conformance.

Exit codes: 0 success, 2 usage or configuration error (one message on stderr, no traceback),
1 any other failure (an unexpected one is one ``internal error`` line; ``-v`` adds the traceback),
130 Ctrl-C, 143 SIGTERM during ``run``, 141 the reader of stdout went away, 124 a call into the
selected plugin past its bound, after a line naming it and every thread's stack (1, after faulthandler's
``Timeout`` line, where the hook held the interpreter lock: :mod:`fd_platforms.loading.watchdog`).
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Sequence

from ..contract.api_version import API_VERSION
from ..contract.errors import FdPlatformsError
from ..ipc.console import printable, write_line
from ..lifecycle.interrupts import Terminated, redeliver_swallowed_signals
from ..loading.discovery import core_version
from ..loading.isolation import describe
from . import check_command, list_command, plan_command, rules_command, run_command
from .output import flush_output, silence_stdout, stdout_failed, take_stdout
from .parser import OneLineParser, plain


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="fd-platforms", description=plain(__doc__.splitlines()[0]))
    parser.add_argument("-v", "--verbose", action="store_true", help="log INFO messages on stderr")
    parser.add_argument(
        "--version", action="version", version=f"fd-platforms {core_version()} (plugin API {API_VERSION})"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)
    for module in (list_command, plan_command, run_command, check_command, rules_command):
        command = module.add_parser(commands)
        command.add_argument(  # after the command too: fd-platforms plan ... -v
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log INFO messages on stderr"
        )
    return parser


class PrintableFormatter(logging.Formatter):
    """Log lines whose control characters are escaped (a plugin's text may hold any)."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; a flag the command does not know is that command's one-line error."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = parse(argv)
    take_stdout()
    redeliver_swallowed_signals()  # a Ctrl-C raised inside a garbage-collection callback still stops us
    handler = logging.StreamHandler()
    handler.setFormatter(PrintableFormatter("fd-platforms: %(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    try:
        code = int(args.run(args))
        flush_output()  # a stdout that cannot take the output fails here, not at interpreter exit
        return code
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly, as other tools do
        silence_stdout()
        return 141
    except FdPlatformsError as exc:
        write_line(f"fd-platforms: error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        write_line("fd-platforms: interrupted")
        return 130
    except Terminated:
        write_line("fd-platforms: terminated")
        return 143
    except Exception as exc:  # noqa: BLE001 - a bug of ours: still one line, the traceback only when asked for
        if stdout_failed(exc):
            silence_stdout()
            write_line(
                f"fd-platforms: error: cannot write the output to stdout: {exc.strerror or describe(exc)}. "
                "Fix: free space where stdout goes (a full disk, /dev/full), or send it elsewhere"
            )
            return 1
        if args.verbose:
            traceback.print_exc()
        write_line(
            f"fd-platforms: internal error: {describe(exc)}. This is a bug in fd-platforms; "
            "rerun with -v for the traceback and report it"
        )
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
