"""What a write's receivers hand from one signal to the next, kept beside the instance.

A receiver of ``pre_save`` or ``pre_delete`` learns what its ``post_*`` twin needs (who could
read the row, what it held). Kept in the instance's ``__dict__``, that would be seen by the
application's own receivers between the two, travel with an instance they pickle or copy (and
fail to: it holds weak references), and outlive a write that failed between the two signals.
Here it is kept by the instance's ``id()`` and a name, checked against a weak reference to the
instance, and dropped with the instance: a write that failed leaves nothing on it.

What one save hands on is kept per save (``push``, ``pop``): a receiver of the application
between realtime's two may save the same instance again, and that save's pair of signals runs
inside the first's; each ``post_save`` takes what its own ``pre_save`` left, the nested save's
the top.
"""

from __future__ import annotations

import weakref
from typing import Any

_held: dict[tuple[int, str], tuple[weakref.ref[Any], Any]] = {}


def put(instance: Any, name: str, value: Any) -> None:
    """Keep ``value`` for ``instance`` under ``name`` (replacing what was kept)."""
    key = (id(instance), name)
    _held[key] = (weakref.ref(instance, lambda reference: _drop(key, reference)), value)


def take(instance: Any, name: str, default: Any = None) -> Any:
    """What was kept for ``instance`` under ``name``, forgotten now; ``default`` if nothing."""
    entry = _held.pop((id(instance), name), None)
    if entry is None or entry[0]() is not instance:
        return default
    return entry[1]


def held(instance: Any, name: str) -> bool:
    """Whether something is kept for ``instance`` under ``name`` (left kept)."""
    entry = _held.get((id(instance), name))
    return entry is not None and entry[0]() is instance


def push(instance: Any, name: str, value: Any) -> None:
    """Keep ``value`` for ``instance`` under ``name`` above what is kept there already."""
    entry = _held.get((id(instance), name))
    held = entry[1] if entry is not None and entry[0]() is instance else []
    put(instance, name, [*held, value])


def pop(instance: Any, name: str, default: Any = None) -> Any:
    """What was last ``push``-ed for ``instance`` under ``name``, forgotten now (what lies
    below stays); ``default`` if nothing."""
    held = take(instance, name, [])
    if not held:
        return default
    if len(held) > 1:
        put(instance, name, held[:-1])
    return held[-1]


def drop(instance: Any, name: str) -> None:
    """Forget what was kept for ``instance`` under ``name`` (a write that failed left it)."""
    _held.pop((id(instance), name), None)


def _drop(key: tuple[int, str], reference: weakref.ref[Any]) -> None:
    entry = _held.get(key)
    if entry is not None and entry[0] is reference:
        _held.pop(key, None)
