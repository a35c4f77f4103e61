"""``python -m tests.django_suite``: see ``run.py``."""

from tests.django_suite.run import main

raise SystemExit(main())
