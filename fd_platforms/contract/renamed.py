"""Keyword arguments renamed so that one concept has one name: the old keyword still works for one minor version.

:func:`renamed_keywords` wraps a function whose keyword ``old`` is now ``new``: a call that passes ``old=`` is
given ``new=`` with a DeprecationWarning at the caller's line; passing both is a ConfigError naming the old one.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

from .errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])

#: The minor version in which a renamed keyword stops working.
REMOVED_IN = "0.3"


def renamed_warning(old: str, new: str, *, stacklevel: int, note: str = "") -> None:
    """The DeprecationWarning for keyword ``old=``, now ``new=``, at the frame ``stacklevel`` above the caller."""
    warnings.warn(
        f"{old}= is deprecated and goes in fd-platforms {REMOVED_IN}: pass {new}={note}",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def renamed_keywords(**renames: str) -> Callable[[F], F]:
    """A decorator: each keyword ``old`` of ``renames`` (``old="new"``) is taken as ``new=``, with a warning."""

    def decorate(function: F) -> F:
        names = list(inspect.signature(function).parameters)
        positions = {new: names.index(new) for new in renames.values()}  # where new= may come positionally

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs or len(args) > positions[new]:
                        raise ConfigError(
                            old, kwargs[old], f"not with {new}= (the same thing under its old name)", f"drop {old}="
                        )
                    renamed_warning(old, new, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return cast(F, wrapper)  # functools.wraps: the same signature

    return decorate
