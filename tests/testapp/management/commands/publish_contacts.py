"""Test-only command: create contacts in a workspace, each in a transaction of its own.

``python manage.py publish_contacts SLUG COUNT [--prefix NAME]`` announces each contact after
its own commit, through whatever ``REALTIME_TRANSPORT`` the process is configured with, so an
end-to-end test can publish from a process that is neither the test nor a server.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from tests.testapp.models import Contact, Workspace


class Command(BaseCommand):
    help = "Create COUNT contacts in the workspace SLUG, one transaction each."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("count", type=int)
        parser.add_argument("--prefix", default="contact")

    def handle(self, *args: Any, **options: Any) -> None:
        workspace = Workspace.objects.get(slug=options["slug"])
        ids: list[int] = []
        for index in range(options["count"]):
            with transaction.atomic():
                contact = Contact.objects.create(
                    workspace=workspace, name=f"{options['prefix']}-{index}"
                )
            ids.append(contact.pk)
        self.stdout.write(" ".join(str(pk) for pk in ids))
