"""Previews, which the database deletes with their attachment: a second level of database
cascade under a contact (as in 0002: ``DO_NOTHING`` without a constraint in the model, and
the cascade added here, a trigger on SQLite)."""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

SQL = {
    "sqlite": [
        "CREATE TRIGGER testapp_preview_cascade AFTER DELETE ON testapp_attachment "
        "BEGIN DELETE FROM testapp_preview WHERE attachment_id = OLD.id; END"
    ],
    "postgresql": [
        "ALTER TABLE testapp_preview ADD CONSTRAINT testapp_preview_attachment_cascade "
        "FOREIGN KEY (attachment_id) REFERENCES testapp_attachment (id) ON DELETE CASCADE"
    ],
    "mysql": [
        "ALTER TABLE testapp_preview ADD CONSTRAINT testapp_preview_attachment_cascade "
        "FOREIGN KEY (attachment_id) REFERENCES testapp_attachment (id) ON DELETE CASCADE"
    ],
}


def add_cascade(apps: Any, schema_editor: Any) -> None:
    for statement in SQL[schema_editor.connection.vendor]:
        schema_editor.execute(statement)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("testapp", "0019_badge")]

    operations = [
        migrations.CreateModel(
            name="Preview",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=100)),
                (
                    "attachment",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="previews",
                        to="testapp.attachment",
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
        migrations.RunPython(add_cascade, migrations.RunPython.noop),
    ]
