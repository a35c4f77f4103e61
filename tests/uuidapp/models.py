"""Models whose keys are not integers: a UUID-keyed account and scope, UUID and text-keyed
records. ``tests.settings_uuid`` runs the end-to-end socket tests of ``test_uuid_keys`` on them.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.db import models
from django.db.models import Q

from realtime import realtime_model


class Account(AbstractUser):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)


class Team(models.Model):
    """The scope, keyed by a UUID."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100)
    slug = models.SlugField(unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Seat", related_name="teams")

    def __str__(self) -> str:
        return self.slug


class Seat(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE)
    account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)

    def __str__(self) -> str:
        return str(self.pk)


@realtime_model(fields=["title"], scope_field="team")
class Memo(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE)
    title = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.title


def may_read_secret(user: Any) -> Q:
    return Q(author=user) | Q(public=True)


@realtime_model(fields=["title"], scope_field="team", guard=may_read_secret)
class Secret(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    title = models.CharField(max_length=100)
    public = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.title


@realtime_model(fields=["text"], user_field="account")
class Alert(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    text = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.text


@realtime_model(fields=["title"], scope_field="team")
class Ticket(models.Model):
    """Keyed by text."""

    code = models.CharField(primary_key=True, max_length=20)
    team = models.ForeignKey(Team, on_delete=models.CASCADE)
    title = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.code


def may_read_chore(user: Any) -> Q:
    return Q(owner=user) | Q(owner__isnull=True)


@realtime_model(
    fields=["title", "rank"],
    scope_field="team",
    filters=["owner", "done", "rank"],
    guard=may_read_chore,
    guard_fields=["owner"],
)
class Chore(models.Model):
    """Queryable, keyed by a UUID, filtered by a UUID account: live queries of UUID keys."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    title = models.CharField(max_length=100)
    done = models.BooleanField(default=False)
    rank = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.title
