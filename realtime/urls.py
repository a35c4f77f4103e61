"""URLs of realtime's HTTP views, for ``include()``: the token view at ``token``.

``path("realtime/", include("realtime.urls"))`` serves it at ``/realtime/token``, where the
JavaScript client's examples fetch it; its name is ``realtime:token``.
"""

from django.urls import path

from realtime import views

app_name = "realtime"

urlpatterns = [
    path("token", views.token, name="token"),
]
