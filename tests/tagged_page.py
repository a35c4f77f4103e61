"""A page rendering ``{% realtime_script %}``, beside realtime's token view and the test
endpoints of ``tests.urls``: the URLconf of the servers of ``tests/test_template_tag.py``,
which serve it under a script prefix (uvicorn's ``--root-path``, ``FORCE_SCRIPT_NAME``)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.template import Context, Engine
from django.urls import include, path

from tests.urls import urlpatterns as test_endpoints

ENGINE = Engine(libraries={"realtime": "realtime.templatetags.realtime"})
PAGE = ENGINE.from_string('{% load realtime %}{% realtime_script "contact" scope="acme" %}')


def page(request: HttpRequest) -> HttpResponse:
    return HttpResponse(PAGE.render(Context({"request": request})))


urlpatterns = [
    *test_endpoints,
    path("page", page),
    path("realtime/", include("realtime.urls")),
]
