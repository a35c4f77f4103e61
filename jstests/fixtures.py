"""Data for the JavaScript client's tests, on the database the daphne servers of those tests use.

Run with the environment the Node harness sets (``DJANGO_SETTINGS_MODULE=tests.settings``,
``REALTIME_TEST_DATABASE_NAME``, ``PYTHONPATH`` at the repository root)::

    python jstests/fixtures.py COMMAND ARGS...   one command, its answer printed as JSON
    python jstests/fixtures.py serve             one JSON array per stdin line, e.g.
                                                 ["user", "ann", "acme"]; one JSON answer
                                                 per stdout line ({"error": ...} on failure)

Commands
    user NAME [SLUG...]             the account NAME (created if new), member of these
                                    workspaces (created if new): {"id", "token", "scopes"}
                                    where "scopes" maps each SLUG to the workspace's id
    token NAME                      a fresh token of NAME: {"token"}
    rename NAME NEW                 rename the account (its tokens stop standing for it and its
                                    sockets are rechecked): {"token"} of the renamed account
    contact SLUG NAME [ORIGIN]      create a contact in workspace SLUG; with ORIGIN, inside a
                                    request carrying it as X-Origin-Id: {"id"}
    publish SLUG TYPE DATA [ORIGIN] broadcast_to_scope(workspace, TYPE, json DATA), with
                                    meta {"origin": ORIGIN} when given: {"published": true}
    case SLUG FIELDS                create a case (the live queries' model) in workspace SLUG
                                    with the json object FIELDS: {"id"}
    edit_case ID FIELDS             set the json object FIELDS on case ID and save it: {"id"}
    delete_case ID                  delete case ID: {"deleted": true}
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def setup() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def workspace(slug: str) -> Any:
    from tests.testapp.models import Workspace

    found, _ = Workspace.objects.get_or_create(slug=slug, defaults={"name": slug.title()})
    return found


def user(name: str, *slugs: str) -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    from realtime.auth import issue_token
    from tests.testapp.models import Membership

    account, _ = get_user_model().objects.get_or_create(username=name)
    scopes: dict[str, Any] = {}
    for slug in slugs:
        scope = workspace(slug)
        Membership.objects.get_or_create(workspace=scope, user=account)
        scopes[slug] = scope.pk
    return {"id": account.pk, "token": issue_token(account), "scopes": scopes}


def token(name: str) -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    from realtime.auth import issue_token

    return {"token": issue_token(get_user_model().objects.get(username=name))}


def rename(name: str, new: str) -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    from realtime.auth import issue_token

    account = get_user_model().objects.get(username=name)
    account.username = new
    account.save()
    return {"token": issue_token(account)}


def contact(slug: str, name: str, origin: str | None = None) -> dict[str, Any]:
    from django.http import HttpRequest, HttpResponse
    from django.test import RequestFactory

    from realtime.middleware import OriginMiddleware
    from tests.testapp.models import Contact

    scope = workspace(slug)
    if origin is None:
        return {"id": Contact.objects.create(workspace=scope, name=name).pk}
    created: list[Any] = []

    def view(request: HttpRequest) -> HttpResponse:
        created.append(Contact.objects.create(workspace=scope, name=name))
        return HttpResponse(status=201)

    OriginMiddleware(view)(RequestFactory().post("/contacts", HTTP_X_ORIGIN_ID=origin))
    return {"id": created[0].pk}


def publish(slug: str, event_type: str, data: str, origin: str | None = None) -> dict[str, Any]:
    from realtime.broadcast import broadcast_to_scope

    meta = {"origin": origin} if origin is not None else None
    broadcast_to_scope(workspace(slug).pk, event_type, json.loads(data), meta=meta)
    return {"published": True}


def case(slug: str, fields: str) -> dict[str, Any]:
    from tests.testapp.models import Case

    return {"id": Case.objects.create(workspace=workspace(slug), **json.loads(fields)).pk}


def edit_case(pk: str, fields: str) -> dict[str, Any]:
    from tests.testapp.models import Case

    found = Case.objects.get(pk=pk)
    for name, value in json.loads(fields).items():
        setattr(found, name, value)
    found.save()
    return {"id": found.pk}


def delete_case(pk: str) -> dict[str, Any]:
    from tests.testapp.models import Case

    Case.objects.get(pk=pk).delete()
    return {"deleted": True}


COMMANDS: dict[str, Callable[..., dict[str, Any]]] = {
    "user": user,
    "token": token,
    "rename": rename,
    "contact": contact,
    "publish": publish,
    "case": case,
    "edit_case": edit_case,
    "delete_case": delete_case,
}


def run(argv: list[str]) -> dict[str, Any]:
    command, *args = argv
    if command not in COMMANDS:
        raise SystemExit(f"unknown command {command!r}")
    return COMMANDS[command](*args)


def serve() -> None:
    from django.db import close_old_connections

    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = run(json.loads(line))
        except Exception as exc:  # answered, so the test that asked fails with the reason
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            close_old_connections()
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


def main(argv: list[str]) -> None:
    setup()
    if argv == ["serve"]:
        serve()
    else:
        sys.stdout.write(json.dumps(run(argv)) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
