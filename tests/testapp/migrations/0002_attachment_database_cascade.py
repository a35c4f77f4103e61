"""Make the database delete a contact's attachments itself (ON DELETE CASCADE).

Django 5.2 has no database-level ``on_delete``: the model says ``DO_NOTHING`` without a
constraint, and this migration adds the cascade (a trigger on SQLite, which cannot add a
foreign key to an existing table).
"""

from typing import Any

from django.db import migrations

SQL = {
    "sqlite": [
        "CREATE TRIGGER testapp_attachment_cascade AFTER DELETE ON testapp_contact "
        "BEGIN DELETE FROM testapp_attachment WHERE contact_id = OLD.id; END"
    ],
    "postgresql": [
        "ALTER TABLE testapp_attachment ADD CONSTRAINT testapp_attachment_contact_cascade "
        "FOREIGN KEY (contact_id) REFERENCES testapp_contact (id) ON DELETE CASCADE"
    ],
    "mysql": [
        "ALTER TABLE testapp_attachment ADD CONSTRAINT testapp_attachment_contact_cascade "
        "FOREIGN KEY (contact_id) REFERENCES testapp_contact (id) ON DELETE CASCADE"
    ],
}


def add_cascade(apps: Any, schema_editor: Any) -> None:
    for statement in SQL[schema_editor.connection.vendor]:
        schema_editor.execute(statement)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("testapp", "0001_initial")]

    operations = [migrations.RunPython(add_cascade, migrations.RunPython.noop)]
