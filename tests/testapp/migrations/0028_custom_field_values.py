"""Parcels: values of field kinds of the application's own, a duration, and a JSONField with
an encoder and a decoder of its own."""

import django.db.models.deletion
from django.db import migrations, models

import tests.testapp.models


class Migration(migrations.Migration):
    dependencies = [
        ("testapp", "0027_shifts_filtered_by_datetime"),
    ]

    operations = [
        migrations.CreateModel(
            name="Parcel",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("rank", models.IntegerField(default=0)),
                ("address", tests.testapp.models.AddressField(null=True)),
                (
                    "picks",
                    tests.testapp.models.PicksField(blank=True, default=list, max_length=200),
                ),
                (
                    "shape",
                    models.JSONField(
                        decoder=tests.testapp.models.PointDecoder,
                        encoder=tests.testapp.models.PointEncoder,
                        null=True,
                    ),
                ),
                ("span", models.DurationField(null=True)),
                (
                    "workspace",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, to="testapp.workspace"
                    ),
                ),
            ],
        ),
    ]
