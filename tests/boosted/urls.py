"""The boosted pages, before the example project's own URLs."""

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import path

from example_project.crm.models import Contact, Workspace
from example_project.urls import urlpatterns as example_urlpatterns


@login_required
def contacts(request: HttpRequest, slug: str) -> HttpResponse:
    workspace = get_object_or_404(Workspace, slug=slug, members=request.user)
    rows = Contact.objects.filter(workspace=workspace).select_related("company").order_by("name")
    return render(request, "boosted/contacts.html", {"workspace": workspace, "contacts": rows})


@login_required
def away(request: HttpRequest) -> HttpResponse:
    return render(request, "boosted/away.html")


urlpatterns = [
    path("boosted/w/<slug:slug>/", contacts, name="boosted_contacts"),
    path("boosted/away/", away, name="boosted_away"),
    *example_urlpatterns,
]
