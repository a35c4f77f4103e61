"""realtime's HTTP views: ``token`` (``realtime.urls`` serves it) and ``metrics``.

``token`` answers a fresh socket bearer for the signed-in account, as ``{"token": "..."}``.

Clients fetch it from scripts: the JavaScript client's ``refreshToken`` option when the server
refuses a token, a page that opens a socket without rendering a token in its HTML. So an
anonymous request gets a JSON 403, never a redirect to the login page, and no answer is ever
cached. The token comes from ``realtime.auth.issue_token``, which the default ``RealtimeAuth``
accepts; a project with its own ``REALTIME_AUTH`` issues its bearers with its own view. It
names the request's session, so that signing out of it ends its sockets at once.
Include ``realtime.urls`` to serve it.

``metrics`` answers the Prometheus text exposition of realtime's metrics (every worker's, with
``PROMETHEUS_MULTIPROC_DIR``); 503 when ``prometheus_client`` is not installed. It is in no
URL list of realtime: a project routes it where only its scraper reaches it.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from realtime import metrics as realtime_metrics
from realtime.auth import issue_token

FORBIDDEN = 403
UNAVAILABLE = 503


@never_cache
@require_GET
def token(request: HttpRequest) -> JsonResponse:
    """Answer ``{"token": ...}`` for a signed-in, active account; 403 for anyone else."""
    if not request.user.is_authenticated or not request.user.is_active:
        return JsonResponse({"detail": "Authentication required."}, status=FORBIDDEN)
    session = getattr(request, "session", None)
    session_key = None if session is None else session.session_key
    return JsonResponse({"token": issue_token(request.user, session_key=session_key)})


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Answer the metrics for a Prometheus scrape; 503 without ``prometheus_client``."""
    exposed = realtime_metrics.exposition()
    if exposed is None:
        return HttpResponse(
            "prometheus_client is not installed: pip install 'django-realtime-models[metrics]'\n",
            status=UNAVAILABLE,
            content_type="text/plain",
        )
    body, content_type = exposed
    return HttpResponse(body, content_type=content_type)
