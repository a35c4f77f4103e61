"""Charters, scoped by a one-to-one key to their workspace."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("testapp", "0021_preference"),
    ]

    operations = [
        migrations.CreateModel(
            name="Charter",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("text", models.CharField(max_length=200)),
                (
                    "workspace",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="charter",
                        to="testapp.workspace",
                    ),
                ),
            ],
        ),
    ]
