"""Invoices and crates: columns the database computes (``GeneratedField``), announced and
filtered by."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("testapp", "0023_desk_notes"),
    ]

    operations = [
        migrations.CreateModel(
            name="Crate",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("items", models.IntegerField(default=0)),
                (
                    "weight",
                    models.GeneratedField(
                        db_persist=True,
                        expression=models.F("items") * 5 + 2,
                        output_field=models.IntegerField(),
                    ),
                ),
                (
                    "workspace",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, to="testapp.workspace"
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="Invoice",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("price", models.IntegerField(default=0)),
                ("quantity", models.IntegerField(default=1)),
                (
                    "total",
                    models.GeneratedField(
                        db_persist=True,
                        expression=models.F("price") * models.F("quantity"),
                        output_field=models.IntegerField(),
                    ),
                ),
                ("note", models.CharField(blank=True, max_length=100)),
                (
                    "workspace",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, to="testapp.workspace"
                    ),
                ),
            ],
        ),
    ]
