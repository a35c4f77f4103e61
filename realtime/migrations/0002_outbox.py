"""Create ``realtime_outbox``: announcements written in their write's transaction (durable
transports). Migrate it into every database whose writes are announced."""

from django.db import migrations, models

import realtime.fields


class Migration(migrations.Migration):
    dependencies = [
        ("realtime", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="OutboxItem",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("txn", models.CharField(max_length=32)),
                ("seq", models.IntegerField()),
                (
                    "created_at",
                    realtime.fields.NaiveUTCDateTimeField(default=realtime.fields.naive_utc_now),
                ),
                ("claimed_until", realtime.fields.NaiveUTCDateTimeField(null=True)),
                ("item", models.BinaryField()),
            ],
            options={
                "verbose_name": "outbox item",
                "db_table": "realtime_outbox",
                "indexes": [
                    models.Index(fields=["txn"], name="realtime_outbox_txn"),
                    models.Index(fields=["created_at"], name="realtime_outbox_created"),
                ],
            },
        ),
    ]
