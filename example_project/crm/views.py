"""The live page and its small JSON API (realtime's own view issues fresh tokens)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRefresh

from example_project.crm.models import Company, Contact, PrivateNote, Workspace
from realtime.auth import issue_token


def htmx_login_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """``login_required`` for a partial htmx fetches into a page: once the session is gone, an
    htmx request is told to reload the whole page (whose own ``login_required`` then asks to sign
    in) rather than redirected, which htmx would follow and swap the sign-in page into the table.
    """
    signed_in_only = login_required(view)

    @wraps(view)
    def partial(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.headers.get("HX-Request") == "true" and not request.user.is_authenticated:
            return HttpResponseClientRefresh()
        return signed_in_only(request, *args, **kwargs)

    return partial


def _workspace(request: HttpRequest, slug: str) -> Workspace:
    return get_object_or_404(Workspace, slug=slug, members=request.user)


@login_required
def home(request: HttpRequest) -> HttpResponse:
    first = Workspace.objects.filter(members=request.user).order_by("name").first()
    if first is None:
        return render(request, "crm/no_workspace.html")
    return redirect("crm:workspace", slug=first.slug)


@login_required
def workspace(request: HttpRequest, slug: str) -> HttpResponse:
    current = _workspace(request, slug)
    return render(
        request,
        "crm/live.html",
        {
            "workspace": current,
            "workspaces": Workspace.objects.filter(members=request.user).order_by("name"),
            "contacts": [_contact_row(contact) for contact in _contacts(current)],
            "companies": Company.objects.filter(workspace=current).order_by("name"),
            "token": issue_token(request.user),
        },
    )


@login_required
def server_rendered(request: HttpRequest, slug: str) -> HttpResponse:
    """The same contacts as a server-rendered page: htmx re-fetches the table's partial when
    realtime tells the page that a contact changed (templates/crm/server_rendered.html)."""
    current = _workspace(request, slug)
    return render(
        request,
        "crm/server_rendered.html",
        {
            "workspace": current,
            "workspaces": Workspace.objects.filter(members=request.user).order_by("name"),
            "contacts": _contacts(current),
        },
    )


@htmx_login_required
def contact_rows(request: HttpRequest, slug: str) -> HttpResponse:
    """The table's rows, read with the session of whoever asks: what they may see, exactly."""
    current = _workspace(request, slug)
    return render(request, "crm/_contact_rows.html", {"contacts": _contacts(current)})


@login_required
def contacts(request: HttpRequest, slug: str) -> JsonResponse:
    current = _workspace(request, slug)
    return JsonResponse({"contacts": [_contact_row(contact) for contact in _contacts(current)]})


@login_required
def contact(request: HttpRequest, pk: int) -> JsonResponse:
    found = Contact.objects.select_related("company").filter(pk=pk).first()
    if found is None or not found.workspace.members.filter(pk=request.user.pk).exists():
        raise Http404("no such contact")
    notes = PrivateNote.objects.filter(contact=found, author=request.user)
    return JsonResponse(
        {
            **_contact_row(found),
            "notes_text": found.notes,
            "tags": [{"name": tag.name, "color": tag.color} for tag in found.tags.all()],
            "private_notes": [{"id": note.pk, "text": note.text} for note in notes],
        }
    )


@login_required
@require_POST
def move_contact(request: HttpRequest, pk: int) -> JsonResponse:
    """Move a contact to another workspace of the user's: the old workspace's pages drop it,
    the new one's show it (realtime tells each reader what changed for them)."""
    found = get_object_or_404(Contact, pk=pk, workspace__members=request.user)
    found.workspace = _workspace(request, request.POST.get("workspace", ""))
    found.save()
    return JsonResponse({"id": found.pk, "workspace": found.workspace.slug})


def _contacts(workspace: Workspace) -> Any:
    return Contact.objects.filter(workspace=workspace).select_related("company").order_by("name")


def _contact_row(contact: Contact) -> dict[str, Any]:
    return {
        "id": contact.pk,
        "name": contact.name,
        "email": contact.email,
        "phone": contact.phone,
        "company": contact.company.name if contact.company else "",
    }
