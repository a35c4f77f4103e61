"""System checks: of the ``REALTIME_*`` settings (``settings``), of the databases (``database``),
of ``@realtime_model`` declarations (``declarations``) and of how the socket is served
(``serving``). Importing this package registers them all.

One more, ``realtime.E040`` (decorated models while realtime is not installed), is registered
by ``realtime.writes.decorator``: without realtime in ``INSTALLED_APPS`` nothing imports
this package, but ``models.py`` imports the decorator."""

from realtime.checks import database, declarations, serving, settings

__all__ = ["database", "declarations", "serving", "settings"]
