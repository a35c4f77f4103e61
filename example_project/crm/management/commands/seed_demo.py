"""``manage.py seed_demo``: demo accounts, workspaces and records for the live page."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from example_project.crm.models import (
    Company,
    Contact,
    Membership,
    Notification,
    PrivateNote,
    Project,
    Tag,
    Task,
    Workspace,
)

PASSWORD = "demo"  # noqa: S105 - demo accounts of a local example


class Command(BaseCommand):
    help = "Create demo users (alice, bob, carol; password 'demo'), workspaces and records."

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        users = {}
        for name in ("alice", "bob", "carol"):
            user, created = get_user_model().objects.get_or_create(
                username=name, defaults={"email": f"{name}@example.com", "is_staff": True}
            )
            if created:
                user.set_password(PASSWORD)
                user.is_superuser = name == "alice"
                user.save()
            users[name] = user
        acme, _ = Workspace.objects.get_or_create(slug="acme", defaults={"name": "Acme"})
        globex, _ = Workspace.objects.get_or_create(slug="globex", defaults={"name": "Globex"})
        for workspace, names in ((acme, ["alice", "bob"]), (globex, ["alice", "carol"])):
            for name in names:
                Membership.objects.get_or_create(workspace=workspace, user=users[name])
        if Contact.objects.exists():
            self.stdout.write("Demo data already there; accounts checked.")
            return
        initech = Company.objects.create(workspace=acme, name="Initech")
        hooli = Company.objects.create(workspace=acme, name="Hooli")
        vip = Tag.objects.create(workspace=acme, name="vip", color="#d97706")
        ann = Contact.objects.create(
            workspace=acme, company=initech, name="Ann Perkins", email="ann@initech.example"
        )
        ann.tags.add(vip)
        Contact.objects.create(
            workspace=acme, company=hooli, name="Ben Wyatt", email="ben@hooli.example"
        )
        Contact.objects.create(workspace=acme, name="Chris Traeger", email="chris@example.com")
        Contact.objects.create(workspace=globex, name="Hank Scorpio", email="hank@globex.example")
        PrivateNote.objects.create(
            workspace=acme, contact=ann, author=users["alice"], text="Alice's own note about Ann"
        )
        project = Project.objects.create(workspace=acme, name="Launch")
        project.shared_with.add(globex)
        Task.objects.create(workspace=acme, project=project, title="Write the press release")
        Notification.objects.create(user=users["alice"], text="Welcome to the realtime CRM")
        self.stdout.write(
            self.style.SUCCESS(
                "Demo data created: sign in as alice, bob or carol (password 'demo')."
            )
        )
