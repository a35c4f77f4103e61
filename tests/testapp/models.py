"""Models the test suite announces: a scope with members, and records of every kind."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.contrib.contenttypes.fields import GenericForeignKey
from django.contrib.contenttypes.models import ContentType
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, connection, models
from django.db.models import Q
from django.db.models.query import ModelIterable

from realtime import RealtimeManager, RealtimeQuerySet, realtime_model


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


@realtime_model(fields=["name"])
class Company(models.Model):
    """Scoped, with one declared field."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, null=True)
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


@realtime_model(fields=["name"])
class Tag(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    name = models.CharField(max_length=50)

    def __str__(self) -> str:
        return self.name


@realtime_model(fields=["name", "company", "born", "score"], relations=["company", "tags"])
class Contact(models.Model):
    """Scoped, with fields of several types, a foreign-key relation and a to-many one."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, null=True)
    company = models.ForeignKey(Company, on_delete=models.CASCADE, null=True, blank=True)
    name = models.CharField(max_length=100)
    email = models.CharField(max_length=100, blank=True)
    notes = models.TextField(blank=True)
    born = models.DateTimeField(null=True, blank=True)
    score = models.DecimalField(max_digits=6, decimal_places=2, null=True, blank=True)
    tags = models.ManyToManyField(Tag, blank=True, related_name="contacts")

    def __str__(self) -> str:
        return self.name


class VipContact(Contact):
    """A proxy: announces as ``contact``."""

    class Meta:
        proxy = True


@realtime_model(fields={"body": "text"}, relations=["target"], name="remark")
class Comment(models.Model):
    """Scoped, with a renamed field, a wire name of its own and a generic relation."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    text = models.TextField()
    target_type = models.ForeignKey(ContentType, on_delete=models.CASCADE)
    target_id = models.PositiveBigIntegerField()
    target = GenericForeignKey("target_type", "target_id")

    def __str__(self) -> str:
        return self.text


@realtime_model(fields=["text"], user_field="user")
class Notification(models.Model):
    """Addressed to one account, one hop away."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True)
    text = models.CharField(max_length=200)

    def __str__(self) -> str:
        return self.text


class Thread(models.Model):
    title = models.CharField(max_length=100)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="threads")

    def __str__(self) -> str:
        return self.title


@realtime_model(fields=["text"], user_field="thread.members")
class Message(models.Model):
    """Addressed to the accounts of a path through a foreign key and a many-to-many."""

    thread = models.ForeignKey(Thread, on_delete=models.CASCADE)
    text = models.CharField(max_length=200)

    def __str__(self) -> str:
        return self.text


def may_read_note(user: Any) -> Q:
    return Q(author=user) | Q(public=True)


@realtime_model(fields=["title"], guard=may_read_note, guard_fields=["author", "public"])
class PrivateNote(models.Model):
    """Guarded: only its author (or everyone, once public) may read it."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    title = models.CharField(max_length=100)
    public = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.title


class Project(models.Model):
    """A root shared with other workspaces: their members read its tasks too."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    shared_with = models.ManyToManyField(Workspace, related_name="shared_projects", blank=True)

    def __str__(self) -> str:
        return self.name

    def realtime_readers(self) -> list[Any]:
        return list(
            Membership.objects.filter(workspace__in=self.shared_with.all()).values_list(
                "user_id", flat=True
            )
        )


@realtime_model(fields=["title"], shared_via="project")
class Task(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    project = models.ForeignKey(Project, on_delete=models.CASCADE)
    title = models.CharField(max_length=100)
    secret = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.title


def may_read_task(user: Any) -> Q:
    return Q(secret=False)


@realtime_model(fields=["title"], shared_via="project", guard=may_read_task, name="guarded_task")
class GuardedTask(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    project = models.ForeignKey(Project, on_delete=models.CASCADE)
    title = models.CharField(max_length=100)
    secret = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.title


@realtime_model(fields=["name"], cascade=["contact"])
class Attachment(models.Model):
    """Deleted by the database with its contact (ON DELETE CASCADE made by the migration)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    contact = models.ForeignKey(
        Contact, on_delete=models.DO_NOTHING, db_constraint=False, related_name="attachments"
    )
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


@realtime_model(fields=["name"], cascade=["attachment"])
class Preview(models.Model):
    """Deleted by the database with its attachment, so with its attachment's contact too
    (ON DELETE CASCADE made by the migration)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    attachment = models.ForeignKey(
        Attachment, on_delete=models.DO_NOTHING, db_constraint=False, related_name="previews"
    )
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


@realtime_model(fields=["label"])
class Item(models.Model):
    """Deleted by Django's own cascade with its folder."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    folder = models.ForeignKey("Folder", on_delete=models.CASCADE, related_name="items")
    label = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.label


class Folder(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)

    def __str__(self) -> str:
        return str(self.pk)


class Plain(models.Model):
    """Not decorated: announces nothing."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


@realtime_model(fields=["name"])
class Twin(models.Model):
    """``Plain`` decorated: the same columns, nothing pointing at it (benchmarks time one
    against the other)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


@realtime_model(scope_field="id", fields=["name"], name="workspace_view", create=False)
class WorkspaceView(Workspace):
    """The scope model itself announcing its updates (a proxy of the scope)."""

    class Meta:
        proxy = True


@realtime_model(fields=["title", "meta", "labels"])
class Document(models.Model):
    """Values that can change in place: a dict and a list in JSON fields."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    title = models.CharField(max_length=100)
    meta = models.JSONField(default=dict)
    labels = models.JSONField(default=list)

    def __str__(self) -> str:
        return self.title


@realtime_model(fields=["name"])
class Vendor(models.Model):
    """Deleting one changes its leads and deals without their signals."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


@realtime_model(fields=["name", "vendor"], relations=["vendor"])
class Lead(models.Model):
    """Set to NULL when its vendor is deleted."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    vendor = models.ForeignKey(
        Vendor, on_delete=models.SET_NULL, null=True, blank=True, related_name="leads"
    )
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


@realtime_model(fields=["name", "vendor"])
class Deal(models.Model):
    """Set to its default (no vendor) when its vendor is deleted."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    vendor = models.ForeignKey(
        Vendor, on_delete=models.SET_DEFAULT, null=True, default=None, related_name="deals"
    )
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


class Profile(models.Model):
    """One hop between an API key and its account (a multi-hop recheck path)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)

    def __str__(self) -> str:
        return str(self.user_id)


class ApiKey(models.Model):
    """An application's own credential: ``REALTIME_RECHECK_MODELS`` watches it."""

    profile = models.ForeignKey(Profile, on_delete=models.CASCADE)
    label = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.label


class TicketQuerySet(RealtimeQuerySet[Any, Any]):
    """A queryset of the application's own, with a method of its own, deriving from realtime's
    (the one line that makes its bulk writes announced)."""

    def still_open(self) -> TicketQuerySet:
        return self.filter(done=False)


class OpenTickets(RealtimeManager[Any]):
    """A manager whose ``get_queryset`` narrows the rows, deriving from realtime's."""

    def get_queryset(self) -> models.QuerySet[Any]:
        return super().get_queryset().filter(done=False)


TicketManager = models.Manager.from_queryset(TicketQuerySet)


class TicketBase(models.Model):
    """An abstract parent declaring a manager made with ``from_queryset``."""

    everything = TicketManager()

    class Meta:
        abstract = True


@realtime_model(fields=["title", "done", "points"])
class Ticket(TicketBase):
    """Written in bulk through managers of every kind."""

    workspace = models.ForeignKey(
        Workspace, on_delete=models.CASCADE, null=True, related_name="tickets"
    )
    title = models.CharField(max_length=100, unique=True)
    done = models.BooleanField(default=False)
    points = models.IntegerField(default=0)

    objects = TicketManager()
    as_manager = TicketQuerySet.as_manager()
    open_tickets = OpenTickets()

    class Meta:
        # The related managers move rows with the base manager (``add()``): realtime's, too.
        base_manager_name = "objects"

    def __str__(self) -> str:
        return self.title


@realtime_model(fields=["quantity"])
class Line(models.Model):
    """A composite primary key: the line ``position`` of order ``order_no``."""

    pk = models.CompositePrimaryKey("order_no", "position")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="lines")
    order_no = models.IntegerField()
    position = models.IntegerField()
    quantity = models.IntegerField(default=1)

    def __str__(self) -> str:
        return f"{self.order_no}/{self.position}"


def may_read_report(user: Any) -> Q:
    """A guard whose shape depends on the account: a team's reports for an account in a team
    (its last name, here), else the account's own."""
    if user.last_name:
        return Q(team=user.last_name)
    return Q(owner=user)


@realtime_model(fields=["title", "team"], guard=may_read_report)
class Report(models.Model):
    """Guarded without ``guard_fields``: every update takes the readers before."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    team = models.CharField(max_length=50, blank=True)
    title = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.title


@realtime_model(fields=["name"], user_field="participants")
class Room(models.Model):
    """Read by its participants: a direct many-to-many (an auto-created through table)."""

    name = models.CharField(max_length=100)
    participants = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="rooms")

    def __str__(self) -> str:
        return self.name


class Chat(models.Model):
    """Members kept in a through model of the application's own: ``Seat``."""

    title = models.CharField(max_length=100)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Seat", related_name="chats")

    def __str__(self) -> str:
        return self.title


class Seat(models.Model):
    chat = models.ForeignKey(Chat, on_delete=models.CASCADE, related_name="seats")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)

    def __str__(self) -> str:
        return f"{self.user_id} in {self.chat_id}"


@realtime_model(fields=["text"], user_field="chat.members")
class ChatLine(models.Model):
    """Read by the chat's members, through the many-to-many and its ``through`` model."""

    chat = models.ForeignKey(Chat, on_delete=models.CASCADE)
    text = models.CharField(max_length=200)

    def __str__(self) -> str:
        return self.text


@realtime_model(fields=["text"], user_field="chat.seats.user")
class ChatPin(models.Model):
    """Read by the chat's members, through the reverse foreign key of its seats."""

    chat = models.ForeignKey(Chat, on_delete=models.CASCADE)
    text = models.CharField(max_length=200)

    def __str__(self) -> str:
        return self.text


def may_read_board(user: Any) -> Q:
    return Q(members=user)


@realtime_model(fields=["name"], guard=may_read_board, guard_fields=["members"])
class Board(models.Model):
    """Guarded by its links: only its members read it."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="boards")

    def __str__(self) -> str:
        return self.name


def card_payload(card: Card) -> dict[str, Any]:
    """A card's data beyond its columns: its company's name (a related row, read with one
    query when it has one), its label in capitals, its due date and its price (JSON forms of
    their own). Some labels make it fail, for the tests of failures; "swallows" makes a query
    that fails and catches the error, as application code may."""
    if card.label == "raises":
        raise RuntimeError("this card's payload fails")
    if card.label == "opaque":
        return {"thing": object()}
    if card.label == "clashes":
        return {"label": "another"}
    if card.label in ("bad query", "swallows"):
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT * FROM testapp_no_such_table")
        except DatabaseError:
            if card.label == "bad query":
                raise
    if card.label == "huge":
        return {"blob": "x" * 10_000}
    company = card.company.name if card.company is not None else None
    return {
        "company_name": company,
        "shout": card.label.upper(),
        "due": card.due,
        "price": card.price,
    }


@realtime_model(fields=["label"], payload=card_payload)
class Card(models.Model):
    """Announced with data of its ``payload=`` besides its declared field."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, null=True)
    company = models.ForeignKey(Company, on_delete=models.SET_NULL, null=True, blank=True)
    label = models.CharField(max_length=100)
    due = models.DateField(null=True, blank=True)
    price = models.DecimalField(max_digits=8, decimal_places=2, null=True, blank=True)

    def __str__(self) -> str:
        return self.label


@realtime_model(scope_field=None, fields=["title"])
class Bulletin(models.Model):
    """Global: read by every signed-in account, whatever scope it reads."""

    title = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.title


def may_read_release(user: Any) -> Q:
    return Q(public=True) | Q(owner=user)


@realtime_model(
    scope_field=None, fields=["title"], guard=may_read_release, guard_fields=["public", "owner"]
)
class Release(models.Model):
    """Global and guarded: every signed-in account once public, its owner before."""

    title = models.CharField(max_length=100)
    public = models.BooleanField(default=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)

    def __str__(self) -> str:
        return self.title


class CatalogManager(RealtimeManager["CatalogItem"]):
    """A manager of the application's own that migrations keep."""

    use_in_migrations = True

    def published(self) -> models.QuerySet[CatalogItem]:
        return self.filter(published=True)


@realtime_model(scope_field=None, fields=["title", "published"])
class CatalogItem(models.Model):
    """Global, with a manager migrations keep (``use_in_migrations``)."""

    title = models.CharField(max_length=100)
    published = models.BooleanField(default=False)

    objects = CatalogManager()

    class Meta:
        base_manager_name = "objects"

    def __str__(self) -> str:
        return self.title


@realtime_model(scope_field=None, fields=["name"])
class Crew(models.Model):
    """Its members are linked by keys other than the primary ones (``to_field``), in a through
    model declared after it."""

    code = models.CharField(max_length=20, unique=True)
    name = models.CharField(max_length=100)
    mates = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        through="Berth",
        through_fields=("crew", "mate"),
        related_name="crews",
    )

    def __str__(self) -> str:
        return self.name


class Berth(models.Model):
    crew = models.ForeignKey(Crew, to_field="code", on_delete=models.CASCADE)
    mate = models.ForeignKey(
        settings.AUTH_USER_MODEL, to_field="username", on_delete=models.CASCADE
    )

    def __str__(self) -> str:
        return f"{self.mate_id} in {self.crew_id}"


@realtime_model(fields=["text"], user_field="crew.mates")
class Logbook(models.Model):
    """Read by a crew's mates: an account path through ``to_field`` keys."""

    crew = models.ForeignKey(Crew, to_field="code", on_delete=models.CASCADE)
    text = models.CharField(max_length=200)

    def __str__(self) -> str:
        return self.text


@realtime_model(scope_field=None, fields=["name"], cascade=["crew"])
class Badge(models.Model):
    """Deleted by the database with its crew, linked by the crew's code (``to_field``; ON
    DELETE CASCADE made by the migration)."""

    crew = models.ForeignKey(
        Crew, to_field="code", on_delete=models.DO_NOTHING, db_constraint=False
    )
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


@realtime_model(fields=["title"], user_field="owner")
class Locker(models.Model):
    """Held by an account named by its username (``to_field``): its events go to the
    account's primary key."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        to_field="username",
        on_delete=models.CASCADE,
        null=True,
        related_name="lockers",
    )
    title = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.title


@realtime_model(fields=["text"], relations=["crew"])
class Sighting(models.Model):
    """Related to a crew by the crew's code (``to_field``): heard on ``crew:<pk>``."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    crew = models.ForeignKey(
        Crew, to_field="code", on_delete=models.CASCADE, null=True, related_name="sightings"
    )
    text = models.CharField(max_length=200)

    def __str__(self) -> str:
        return self.text


def may_read_case(user: Any) -> Q:
    """Cases are read by everyone in their workspace, but a private one only by its assignee."""
    return Q(private=False) | Q(assignee=user)


@realtime_model(
    fields=["title", "status", "priority"],
    filters=["status", "company", "assignee", "priority", "due", "private"],
    guard=may_read_case,
    guard_fields=["private", "assignee"],
)
class Case(models.Model):
    """The live queries' model: a ticket of the spec's shape (filtered by status, company,
    assignee, priority and due date), guarded."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, null=True)
    company = models.ForeignKey(Company, on_delete=models.SET_NULL, null=True, blank=True)
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    title = models.CharField(max_length=100)
    status = models.CharField(max_length=20, default="open")
    priority = models.IntegerField(default=0)
    due = models.DateField(null=True, blank=True)
    private = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.title


@realtime_model(fields=["text", "level"], user_field="user", filters=["level", "read"])
class Alert(models.Model):
    """Addressed to one account, queryable: live queries of an account model."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    text = models.CharField(max_length=200)
    level = models.IntegerField(default=0)
    read = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.text


@realtime_model(fields=["quantity"], filters=["shelf", "quantity"])
class Stock(models.Model):
    """Queryable with a composite primary key: the stock of item ``sku`` in ``warehouse``."""

    pk = models.CompositePrimaryKey("warehouse", "sku")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    warehouse = models.IntegerField()
    sku = models.IntegerField()
    shelf = models.IntegerField(default=0)
    quantity = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.sku} in {self.warehouse}"


@realtime_model(fields=["size"], filters=["size"])
class Bin(models.Model):
    """Queryable, keyed by text: windows ordered by keys the database's collation sorts."""

    code = models.CharField(primary_key=True, max_length=20)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    size = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.code


@realtime_model(fields=["title", "status", "priority"], filters=["status", "priority"])
class Job(models.Model):
    """Queryable and unguarded: what live queries cost without a guard's check."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    title = models.CharField(max_length=100)
    status = models.CharField(max_length=20, default="open")
    priority = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.title


@realtime_model(fields=["name"])
class Animal(models.Model):
    """Scoped, the parent of a multi-table child (``Dog``)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, null=True)
    name = models.CharField(max_length=50)

    def __str__(self) -> str:
        return self.name


class Dog(Animal):
    """A multi-table child of a decorated model: its own table holds ``breed`` and the key
    pointing at its parent's row; it announces as ``animal``."""

    breed = models.CharField(max_length=50, blank=True)


class EachAsItIs(ModelIterable):  # type: ignore[type-arg]
    """Reads each animal as the class it is (a dog's row as a ``Dog``, built from the join
    ``select_related`` made), as django-model-utils' ``select_subclasses()`` and
    django-polymorphic read a parent's rows: one fetch, instances of several classes."""

    def __iter__(self) -> Iterator[Any]:
        for animal in super().__iter__():
            try:
                yield animal.dog
            except Dog.DoesNotExist:
                yield animal


def each_as_it_is(animals: models.QuerySet[Any, Any]) -> models.QuerySet[Any, Any]:
    """``animals`` read each as the class it is (``EachAsItIs``)."""
    found = animals.select_related("dog")
    found._iterable_class = EachAsItIs
    return found


class PublishedArticles(RealtimeManager["Article"]):
    """A default manager of the application's own that filters its rows (``get_queryset``),
    built the documented way: on ``RealtimeManager``."""

    def get_queryset(self) -> RealtimeQuerySet[Any, Any]:
        return super().get_queryset().filter(published=True)  # type: ignore[return-value]


@realtime_model(scope_field=None, fields=["title", "published"])
class Article(models.Model):
    """Global, its default manager showing only the published articles."""

    title = models.CharField(max_length=100)
    published = models.BooleanField(default=False)

    objects = PublishedArticles()
    everything = RealtimeManager["Article"]()

    class Meta:
        base_manager_name = "everything"

    def __str__(self) -> str:
        return self.title


class PublishedPlainArticles(models.Manager["PlainArticle"]):
    """``PublishedArticles`` as an undecorated model has it: on Django's ``Manager``."""

    def get_queryset(self) -> models.QuerySet[PlainArticle]:
        return super().get_queryset().filter(published=True)


class PlainArticle(models.Model):
    """``Article``'s undecorated twin: what Django alone does."""

    title = models.CharField(max_length=100)
    published = models.BooleanField(default=False)

    objects = PublishedPlainArticles()

    def __str__(self) -> str:
        return self.title


class Shelf(models.Model):
    """Links to articles, decorated or not: related managers derived from a filtering one."""

    name = models.CharField(max_length=100)
    articles = models.ManyToManyField(Article, related_name="shelves", blank=True)
    plain_articles = models.ManyToManyField(PlainArticle, related_name="shelves", blank=True)

    def __str__(self) -> str:
        return self.name


# Rows a delete sets to NULL or to another row move their readers, as an update() would -------


class Department(models.Model):
    """What a memo's guard reads: the department's members read its memos."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="departments")

    def __str__(self) -> str:
        return self.name


def general_department() -> Any:
    """Where a memo goes when its department is deleted: the one named "general", if any."""
    return Department.objects.filter(name="general").values_list("pk", flat=True).first()


def may_read_memo(user: Any) -> Q:
    return Q(owner=user) | Q(department__members=user)


@realtime_model(fields=["title"], guard=may_read_memo, guard_fields=["department", "owner"])
class Memo(models.Model):
    """Guarded by a key its target's delete rewrites (``SET``): to "general", or ``NULL``."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    department = models.ForeignKey(
        Department, on_delete=models.SET(general_department), null=True, related_name="memos"
    )
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    title = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.title


class Squad(models.Model):
    """The accounts a briefing reaches."""

    name = models.CharField(max_length=100)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="squads")

    def __str__(self) -> str:
        return self.name


@realtime_model(fields=["text"], user_field="squad.members")
class Briefing(models.Model):
    """Read by a squad's members: a squad deleted leaves it to nobody (``SET_NULL``)."""

    squad = models.ForeignKey(Squad, on_delete=models.SET_NULL, null=True)
    text = models.CharField(max_length=200)

    def __str__(self) -> str:
        return self.text


@realtime_model(fields=["title"], shared_via="project", name="sketch")
class Sketch(models.Model):
    """Shared through a project that may be deleted before it (``SET_NULL``)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    project = models.ForeignKey(Project, on_delete=models.SET_NULL, null=True)
    title = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.title


# A OneToOneField is a foreign key: Django derives it from one, marked one_to_one ------------


@realtime_model(fields=["theme"], user_field="user")
class Preference(models.Model):
    """Addressed to one account through a one-to-one key: handed to another account, it
    leaves the one and enters the other, as a foreign key's row does."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="preference"
    )
    theme = models.CharField(max_length=20)

    def __str__(self) -> str:
        return self.theme


@realtime_model(fields=["text"])
class Charter(models.Model):
    """Scoped by a one-to-one key: a workspace has one charter."""

    workspace = models.OneToOneField(Workspace, on_delete=models.CASCADE, related_name="charter")
    text = models.CharField(max_length=200)

    def __str__(self) -> str:
        return self.text


class Desk(models.Model):
    """The accounts a desk note reaches."""

    name = models.CharField(max_length=100)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="desks")

    def __str__(self) -> str:
        return self.name


@realtime_model(fields=["text"], user_field="desk.members")
class DeskNote(models.Model):
    """Read by the members of its desk, reached through a one-to-one key: a desk has one."""

    desk = models.OneToOneField(Desk, on_delete=models.CASCADE, related_name="note")
    text = models.CharField(max_length=200)

    def __str__(self) -> str:
        return self.text


@realtime_model(fields=["price", "quantity", "total", "note"])
class Invoice(models.Model):
    """Its total a column the database computes (``GeneratedField``): its events tell the
    total the row holds, which Django 5.2 does not read back after an update."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    price = models.IntegerField(default=0)
    quantity = models.IntegerField(default=1)
    total = models.GeneratedField(
        expression=models.F("price") * models.F("quantity"),
        output_field=models.IntegerField(),
        db_persist=True,
    )
    note = models.CharField(max_length=100, blank=True)

    def __str__(self) -> str:
        return f"{self.quantity} x {self.price}"


@realtime_model(fields=["reading"], filters=["reading"])
class Gauge(models.Model):
    """Queryable by a float column, which may hold infinities (and NaN on PostgreSQL)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    reading = models.FloatField(null=True)

    def __str__(self) -> str:
        return str(self.reading)


@realtime_model(fields=["items"], filters=["weight"])
class Crate(models.Model):
    """Queryable by a column the database computes (``GeneratedField``)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    items = models.IntegerField(default=0)
    weight = models.GeneratedField(
        expression=models.F("items") * 5 + 2,
        output_field=models.IntegerField(),
        db_persist=True,
    )

    def __str__(self) -> str:
        return f"{self.items} items"


# A queryset of the application's own that decides what its writes are ----------------------


class SoftDeleting(models.QuerySet[Any, Any]):
    """A soft delete, as django-model-utils' ``SoftDeletableQuerySet`` and django-safedelete
    make one: ``delete()`` marks the rows removed (``hard=True`` deletes them, as safedelete's
    ``force_policy``), and ``update()`` and ``bulk_create`` take an argument of their own."""

    def delete(self, hard: bool = False) -> Any:
        if hard:
            return super().delete()
        return self.update(removed=True)

    delete.alters_data = True  # type: ignore[attr-defined]
    delete.queryset_only = True  # type: ignore[attr-defined]

    def update(self, reason: str = "", **values: Any) -> int:
        return super().update(**values)

    def bulk_create(self, objs: Any, *args: Any, removed: bool = False, **kwargs: Any) -> Any:
        objs = list(objs)
        for obj in objs:
            obj.removed = removed
        return super().bulk_create(objs, *args, **kwargs)


# (Mixed querysets: django-stubs types as_manager() per class, and update() differs.)
class SoftDeletingFirst(RealtimeQuerySet[Any, Any], SoftDeleting):  # type: ignore[misc, override]
    """realtime's queryset first among the bases: its methods run before the application's."""


class SoftDeletingLast(SoftDeleting, RealtimeQuerySet[Any, Any]):  # type: ignore[override]
    """realtime's queryset last among the bases: the application's methods run first."""


@realtime_model(fields=["name", "removed"])
class Draft(models.Model):
    """Deleted softly, through querysets taking realtime's either way."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="drafts")
    name = models.CharField(max_length=50)
    removed = models.BooleanField(default=False)

    objects = SoftDeletingFirst.as_manager()
    realtime_last = SoftDeletingLast.as_manager()

    def __str__(self) -> str:
        return self.name


@realtime_model(fields=["title", "starts"], filters=["starts"])
class Shift(models.Model):
    """Queryable by a datetime: the live queries of ``USE_TZ = False`` (naive columns)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    title = models.CharField(max_length=100)
    starts = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.title


# Values of field kinds of the application's own -----------------------------------------------


@dataclasses.dataclass
class Address:
    """A value that changes in place, kept as JSON text by ``AddressField``."""

    street: str
    city: str


class AddressField(models.TextField):  # type: ignore[type-arg]
    """An ``Address`` kept as JSON text: a text column whose value is an object."""

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Address | None:
        return None if value is None else Address(**json.loads(value))

    def to_python(self, value: Any) -> Address | None:
        if value is None or isinstance(value, Address):
            return value
        return Address(**json.loads(value))

    def get_prep_value(self, value: Any) -> str | None:
        return None if value is None else json.dumps(dataclasses.asdict(value))


class PicksField(models.CharField):  # type: ignore[type-arg]
    """A list kept as comma-separated text: a ``CharField`` whose value is a list, as
    django-multiselectfield's."""

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> list[str] | None:
        return None if value is None else [part for part in value.split(",") if part]

    def to_python(self, value: Any) -> list[str] | None:
        if value is None or isinstance(value, list):
            return value
        return [part for part in value.split(",") if part]

    def get_prep_value(self, value: Any) -> str | None:
        return None if value is None else ",".join(value)


@dataclasses.dataclass
class Point:
    """A value a ``JSONField`` holds through an encoder and a decoder of the application's."""

    x: int
    y: int


class PointEncoder(DjangoJSONEncoder):
    """Writes a ``Point`` as ``{"x": ..., "y": ...}`` and a set as a sorted list, and dates
    as Django's encoder does (``Z``, milliseconds)."""

    def default(self, o: Any) -> Any:
        if isinstance(o, Point):
            return {"x": o.x, "y": o.y}
        if isinstance(o, set):
            return sorted(o)
        return super().default(o)


class PointDecoder(json.JSONDecoder):
    """Reads ``{"x": ..., "y": ...}`` back as a ``Point``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, object_hook=self.point, **kwargs)

    @staticmethod
    def point(found: dict[str, Any]) -> Any:
        return Point(**found) if found.keys() == {"x", "y"} else found


@realtime_model(fields=["address", "picks", "shape", "span"], filters=["rank"])
class Parcel(models.Model):
    """Values of field kinds of the application's own, a duration, and a ``JSONField`` with
    an encoder and a decoder of its own."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
    rank = models.IntegerField(default=0)
    address = AddressField(null=True)
    picks = PicksField(max_length=200, default=list, blank=True)
    shape = models.JSONField(null=True, encoder=PointEncoder, decoder=PointDecoder)
    span = models.DurationField(null=True)

    def __str__(self) -> str:
        return f"parcel {self.pk}"
