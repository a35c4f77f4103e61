"""realtime inside Django's test suite: its settings, its app and the runner that records.

``runtests.py`` installs only the test apps it finds beside it, so this package is linked
into the ``tests/`` folder of Django's sdist and named among the test labels: its app config
installs realtime itself. Nothing here imports Django's models at import time.
"""
