"""A small CRM that uses every feature of realtime.

Workspaces are the scope: their members read what is announced in them. Companies, contacts
and tags are scoped records; private notes are guarded (only their author reads them);
projects are shared with other workspaces, and their tasks reach those workspaces' members
too; notifications are addressed to one account.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q

from realtime import realtime_model


class Workspace(models.Model):
    objects: models.Manager[Workspace] = models.Manager()
    name = models.CharField(max_length=100)
    slug = models.SlugField(unique=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="workspaces"
    )

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    objects: models.Manager[Membership] = models.Manager()
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    role = models.CharField(max_length=20, default="member")

    class Meta:
        unique_together = [("workspace", "user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.workspace}"


@realtime_model(fields=["name", "website"])
class Company(models.Model):
    objects: models.Manager[Company] = models.Manager()
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    website = models.URLField(blank=True)

    class Meta:
        verbose_name_plural = "companies"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


@realtime_model(fields=["name", "color"])
class Tag(models.Model):
    objects: models.Manager[Tag] = models.Manager()
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    name = models.CharField(max_length=40)
    color = models.CharField(max_length=7, default="#888888")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


@realtime_model(
    fields=["name", "email", "phone", "company"],
    relations=["company", "tags"],
    filters=["company"],
)
class Contact(models.Model):
    objects: models.Manager[Contact] = models.Manager()
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    company = models.ForeignKey(
        Company, on_delete=models.SET_NULL, null=True, blank=True, related_name="contacts"
    )
    name = models.CharField(max_length=100)
    email = models.EmailField(blank=True)
    phone = models.CharField(max_length=40, blank=True)
    notes = models.TextField(blank=True)
    tags = models.ManyToManyField(Tag, blank=True, related_name="contacts")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


def readable_notes(user: Any) -> Q:
    """A private note is read by its author only."""
    return Q(author=user)


@realtime_model(
    fields=["text", "contact"],
    relations=["contact"],
    guard=readable_notes,
    guard_fields=["author"],
)
class PrivateNote(models.Model):
    objects: models.Manager[PrivateNote] = models.Manager()
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    contact = models.ForeignKey(Contact, on_delete=models.CASCADE, related_name="private_notes")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return self.text[:40]


@realtime_model(fields=["name"])
class Project(models.Model):
    objects: models.Manager[Project] = models.Manager()
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    shared_with = models.ManyToManyField(Workspace, blank=True, related_name="shared_projects")

    def __str__(self) -> str:
        return self.name

    def realtime_readers(self) -> list[Any]:
        """Members of the workspaces the project is shared with also read its tasks."""
        return list(
            Membership.objects.filter(workspace__in=self.shared_with.all()).values_list(
                "user_id", flat=True
            )
        )


@realtime_model(fields=["title", "done", "project"], relations=["project"], shared_via="project")
class Task(models.Model):
    objects: models.Manager[Task] = models.Manager()
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tasks")
    title = models.CharField(max_length=200)
    done = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.title


@realtime_model(fields=["text", "read"], user_field="user")
class Notification(models.Model):
    objects: models.Manager[Notification] = models.Manager()
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    text = models.CharField(max_length=200)
    read = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.text
