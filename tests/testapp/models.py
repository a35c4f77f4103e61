"""Models the test suite announces: a scope with members, and records of every kind."""

from django.conf import settings
from django.db import models


class Workspace(models.Model):
    """The scope: clients name it by slug; its members read what is announced in it."""

    name = models.CharField(max_length=100)
    slug = models.SlugField(unique=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="workspaces"
    )

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    role = models.CharField(max_length=20, default="member")

    class Meta:
        unique_together = [("workspace", "user")]

    def __str__(self) -> str:
        return f"{self.user_id} in {self.workspace_id}"
