"""Django's own ORM tests as realtime's contract: run plain, then with every model decorated.

``python -m tests.django_suite`` (``run.py``) takes Django's sdist for the Django installed,
runs the ORM test apps of ``APPS`` with Django's ``runtests.py`` twice — as Django ships them,
and with every concrete model of those apps decorated by ``@realtime_model`` right after its
class statement — and fails on any test that passes plain and fails decorated, but for the
statement counts ``allowed.py`` lists (each documented in ``docs/limits.md``).
"""
