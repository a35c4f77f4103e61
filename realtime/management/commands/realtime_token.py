"""``manage.py realtime_token <account>``: print a token for one account, and nothing else.

What a script or a terminal needs to try a client (``export REALTIME_TOKEN="$(python manage.py
realtime_token alice)"``): ``manage.py shell -c`` would capture the shell's banner with the
token. The account is named by the user model's ``USERNAME_FIELD`` (``--id`` names it by its
primary key instead). The token is ``issue_token``'s, which the default ``RealtimeAuth``
reads; a project whose ``REALTIME_AUTH`` reads other tokens makes its own.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from realtime.tokens import issue_token


class Command(BaseCommand):
    help = (
        "Print a realtime token for one account (by its username, or its primary key with "
        "--id), and nothing else."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("account", help="the account's username (its primary key with --id)")
        parser.add_argument(
            "--id", action="store_true", help="read ACCOUNT as the account's primary key"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        field = "pk" if options["id"] else user_model.USERNAME_FIELD
        try:
            user = user_model._default_manager.get(**{field: options["account"]})
        except (user_model.DoesNotExist, ValueError, ValidationError):
            raise CommandError(
                f"No account has {field} {options['account']!r}"
                + ("" if options["id"] else " (give --id to name it by its primary key)")
            ) from None
        if not getattr(user, "is_active", True):
            raise CommandError(
                f"Account {options['account']!r} is inactive: its token would be refused"
            )
        self.stdout.write(issue_token(user))
