"""The test settings without ``"realtime"`` in ``INSTALLED_APPS``, a newcomer's mistake:
``manage.py check`` under them must report ``realtime.E040`` (``tests/test_checks_serving.py``).
"""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS as INSTALLED

INSTALLED_APPS = [app for app in INSTALLED if app != "realtime"]
