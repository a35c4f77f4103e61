"""The example project reads every ``REALTIME_*`` setting from its environment (and ``.env``),
under the setting's own name, as the type of its default."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tests.example import ExampleProject

READ = (
    "import json; from django.conf import settings; print(json.dumps({name: getattr(settings, "
    "name, None) for name in ('REALTIME_TRANSPORT', 'REALTIME_REDIS_URL', 'REALTIME_SEND_TIMEOUT',"
    " 'REALTIME_AUTO_TRIM', 'REALTIME_MAX_CHANNELS', 'REALTIME_ALLOWED_ORIGINS', "
    "'REALTIME_RECHECK_MODELS', 'REALTIME_SCOPE_SLUG_FIELD', 'REALTIME_SCOPE_MODEL', "
    "'REALTIME_MAX_UNAUTHENTICATED_PER_ADDRESS')}))"
)


def test_the_example_project_reads_every_realtime_setting_from_its_environment() -> None:
    with tempfile.TemporaryDirectory() as workdir:
        project = ExampleProject(
            Path(workdir),
            REALTIME_TRANSPORT="redis",
            REALTIME_REDIS_URL="redis://127.0.0.1:6379/0",
            REALTIME_SEND_TIMEOUT="10",
            REALTIME_AUTO_TRIM="false",
            REALTIME_MAX_CHANNELS="50",
            REALTIME_ALLOWED_ORIGINS="https://a.example,https://b.example",
            REALTIME_RECHECK_MODELS='{"crm.Contact": "workspace"}',
            REALTIME_SCOPE_SLUG_FIELD="name",
            REALTIME_MAX_UNAUTHENTICATED_PER_ADDRESS="8",
        )
        read = json.loads(project.shell(READ))
    assert read == {
        "REALTIME_TRANSPORT": "redis",
        "REALTIME_REDIS_URL": "redis://127.0.0.1:6379/0",
        "REALTIME_SEND_TIMEOUT": 10.0,
        "REALTIME_AUTO_TRIM": False,
        "REALTIME_MAX_CHANNELS": 50,
        "REALTIME_ALLOWED_ORIGINS": ["https://a.example", "https://b.example"],
        "REALTIME_RECHECK_MODELS": {"crm.Contact": "workspace"},
        "REALTIME_SCOPE_SLUG_FIELD": "name",
        "REALTIME_SCOPE_MODEL": "crm.Workspace",  # the example's own, unless given
        "REALTIME_MAX_UNAUTHENTICATED_PER_ADDRESS": 8,
    }
