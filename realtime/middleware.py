"""``OriginMiddleware``: carry a request's ``X-Origin-Id`` to the announcements it causes.

A client stamps a write with an origin of its own (``<instance>.<n>``) and drops the one frame
that echoes it. The value lives in a context variable for the duration of the request, so every
write the request makes, a signal's included, carries it. Values longer than 64 characters, or
empty, are left out. Writes outside a request have no origin.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from realtime import limits

_origin: ContextVar[str | None] = ContextVar("realtime_origin", default=None)
_META_KEY = "HTTP_" + limits.ORIGIN_HEADER.upper().replace("-", "_")


def current_origin() -> str | None:
    """The origin of the request being served, or ``None``."""
    return _origin.get()


def clean_origin(value: Any) -> str | None:
    """Keep an origin only when it is a non-empty string of at most 64 characters."""
    if isinstance(value, str) and 0 < len(value) <= limits.MAX_ORIGIN_LENGTH:
        return value
    return None


class OriginMiddleware:
    """Read ``X-Origin-Id`` into the context for the duration of each request."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        token = _origin.set(clean_origin(request.META.get(_META_KEY)))
        try:
            return self.get_response(request)
        finally:
            _origin.reset(token)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        token = _origin.set(clean_origin(request.META.get(_META_KEY)))
        try:
            response: Awaitable[HttpResponseBase] = self.get_response(request)
            return await response
        finally:
            _origin.reset(token)
