"""Which Redis commands each adapter method issues: declared once, beside the method, and read by :mod:`unilog.ops.acl`.

``@issues("xadd", "xack", via=("explained",))`` on a method names the commands it sends itself, as ACL rules name
them (lower case; a subcommand as ``xinfo|stream``), counting those of its pipelines, of MULTI/EXEC and of its Lua
script (:func:`script_commands` reads them from the script's text), and the adapter methods it calls (``via``),
whose commands it issues too. :func:`commands_of` resolves the whole set. A new command is one edit: the method's
declaration; the ACL of every kind of process that calls the method follows (``unilog acl``).
``tests/test_acl_commands.py`` watches the methods at work (``MONITOR``) and fails when one issues a command it does
not declare.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_COMMANDS = "__redis_commands__"
_VIA = "__redis_via__"
_CALL = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'")


def issues(*commands: str, via: Iterable[str] = ()) -> Callable[[F], F]:
    """Declare the Redis commands the decorated method (or function) issues, and the adapter methods it calls.

    The declaration is an attribute set on the function, which is returned as it was: a coroutine function stays
    one, and a declaration in an asyncio source of ``unilog/engine/_async/`` is copied into its generated face."""
    for command in commands:
        if command != command.lower() or " " in command:
            raise ValueError(f"name {command!r} as an ACL rule does: lower case, a subcommand as 'xinfo|stream'")

    def mark(function: F) -> F:
        setattr(function, _COMMANDS, frozenset(commands))
        setattr(function, _VIA, tuple(via))
        return function

    return mark


def declared(function: Any) -> frozenset[str] | None:
    """The commands ``function`` declares itself (not through ``via``), or None when it declares nothing."""
    return getattr(function, _COMMANDS, None)


def commands_of(function: Any, owner: Any = None) -> frozenset[str]:
    """Every command ``function`` may issue: its own, and those of the methods of ``owner`` it calls, transitively.
    Raises ``LookupError`` for a function that declares nothing (every adapter method must)."""
    own = declared(function)
    if own is None:
        raise LookupError(f"{getattr(function, '__qualname__', function)!r} declares no Redis commands (@issues)")
    found = set(own)
    for name in getattr(function, _VIA):
        if owner is None:
            raise LookupError(f"{function.__qualname__!r} calls {name!r}: name the class that holds it")
        found |= commands_of(getattr(owner, name), owner)
    return frozenset(found)


def methods_of(cls: type) -> dict[str, Any]:
    """The methods of ``cls`` (its bases' included) that declare their commands, by name."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        found |= {name: value for name, value in vars(klass).items() if declared(value) is not None}
    return found


def script_commands(script: str) -> tuple[str, ...]:
    """The commands a Lua script runs (``redis.call('XADD', ...)``), as ACL rules name them: the script runs them as
    the user who called it, so that user needs them too."""
    return tuple(sorted({name.lower() for name in _CALL.findall(script)}))
