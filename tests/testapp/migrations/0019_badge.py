"""Badges, which the database deletes with their crew, linked by its code (``to_field``).

As in 0002: ``DO_NOTHING`` without a constraint in the model, and the cascade added here (a
trigger on SQLite).
"""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

SQL = {
    "sqlite": [
        "CREATE TRIGGER testapp_badge_cascade AFTER DELETE ON testapp_crew "
        "BEGIN DELETE FROM testapp_badge WHERE crew_id = OLD.code; END"
    ],
    "postgresql": [
        "ALTER TABLE testapp_badge ADD CONSTRAINT testapp_badge_crew_cascade "
        "FOREIGN KEY (crew_id) REFERENCES testapp_crew (code) ON DELETE CASCADE"
    ],
    "mysql": [
        "ALTER TABLE testapp_badge ADD CONSTRAINT testapp_badge_crew_cascade "
        "FOREIGN KEY (crew_id) REFERENCES testapp_crew (code) ON DELETE CASCADE"
    ],
}


def add_cascade(apps: Any, schema_editor: Any) -> None:
    for statement in SQL[schema_editor.connection.vendor]:
        schema_editor.execute(statement)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("testapp", "0018_unlinked_audiences")]

    operations = [
        migrations.CreateModel(
            name="Badge",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=100)),
                (
                    "crew",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        to="testapp.crew",
                        to_field="code",
                    ),
                ),
            ],
        ),
        migrations.RunPython(add_cascade, migrations.RunPython.noop),
    ]
