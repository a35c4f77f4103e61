"""Create ``firm_channel_messages`` with firm-channel's exact schema and index names.

``migrate --fake-initial`` adopts a table that firm-channel already created: the first
operation is a plain ``CreateModel``, which is what Django looks for.
"""

from django.db import migrations, models

import realtime.fields

INDEXES = {
    "index_firm_channel_messages_on_channel": "channel",
    "index_firm_channel_messages_on_channel_hash": "channel_hash",
    "index_firm_channel_messages_on_created_at": "created_at",
}


class Migration(migrations.Migration):
    initial = True

    operations = [
        migrations.CreateModel(
            name="ChannelMessage",
            fields=[
                (
                    "id",
                    realtime.fields.MessageIdField(primary_key=True, serialize=False),
                ),
                ("channel", realtime.fields.ChannelField()),
                ("payload", models.BinaryField()),
                ("channel_hash", models.BigIntegerField()),
                (
                    "created_at",
                    realtime.fields.NaiveUTCDateTimeField(default=realtime.fields.naive_utc_now),
                ),
            ],
            options={
                "db_table": "firm_channel_messages",
                "verbose_name": "channel message",
            },
        ),
        *(
            migrations.RunSQL(
                sql=f"CREATE INDEX {name} ON firm_channel_messages ({column})",
                # Dropping the table (the reverse of CreateModel) drops its indexes.
                reverse_sql=migrations.RunSQL.noop,
            )
            for name, column in INDEXES.items()
        ),
    ]
