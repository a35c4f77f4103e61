"""``token``: a fresh socket bearer for the signed-in account, as ``{"token": "..."}``.

Clients fetch it from scripts: the JavaScript client's ``refreshToken`` option when the server
refuses a token, a page that opens a socket without rendering a token in its HTML. So an
anonymous request gets a JSON 403, never a redirect to the login page, and no answer is ever
cached. The token comes from ``realtime.auth.issue_token``, which the default ``RealtimeAuth``
accepts; a project with its own ``REALTIME_AUTH`` issues its bearers with its own view.
Include ``realtime.urls`` to serve it.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from realtime.auth import issue_token

FORBIDDEN = 403


@never_cache
@require_GET
def token(request: HttpRequest) -> JsonResponse:
    """Answer ``{"token": ...}`` for a signed-in, active account; 403 for anyone else."""
    if not request.user.is_authenticated or not request.user.is_active:
        return JsonResponse({"detail": "Authentication required."}, status=FORBIDDEN)
    return JsonResponse({"token": issue_token(request.user)})
