"""The command line's parser: every usage error is one line with what was likely meant, exit 2.

``argparse`` prints a usage block before its error; here a usage error is one line,
``fd-platforms <command>: error: ...``, with a did-you-mean for a misspelled flag, command or
choice. ``--help`` shows every default.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import Any, NoReturn

from ..contract.errors import closest_name
from ..ipc.console import write_line

USAGE_EXIT = 2
_CHOICE = re.compile(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)")
_UNKNOWN = re.compile(r"unrecognized arguments: (.*)")


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends each option with its default, where it has one (None and False are no default)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        no_default = action.default is None or action.default is False or action.default is argparse.SUPPRESS
        if "(default" in text or no_default or not action.option_strings:
            return text
        return f"{text} (default: {action.default})"


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line with a did-you-mean; defaults shown in ``--help``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """One line on stderr, the usage error with a did-you-mean (or where ``--help`` is), and exit 2."""
        write_line(f"{self.prog}: error: {message}{self._hint(message)}")
        sys.exit(USAGE_EXIT)

    def _hint(self, message: str) -> str:
        choice = _CHOICE.search(message)
        if choice:
            options = [option.strip(" '") for option in choice.group(3).split(",")]
            close = closest_name(choice.group(2), options)
            return f"; did you mean {close!r}?" if close else ""
        unknown = _UNKNOWN.search(message)
        if unknown:
            first = unknown.group(1).split()[0].split("=")[0]
            flag = difflib.get_close_matches(first, self._option_strings(), n=1, cutoff=0.6)
            return f"; did you mean {flag[0]}?" if flag else f"; see {self.prog} --help"
        return f"; see {self.prog} --help"

    def _option_strings(self) -> list[str]:
        return [option for action in self._actions for option in action.option_strings]


def plain(text: str) -> str:
    """A docstring line for ``--help``: without reST's double backticks."""
    return text.replace("``", "")
