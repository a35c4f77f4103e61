"""System checks: of the ``REALTIME_*`` settings (``settings``), of the database the table
transport runs on (``database``) and of ``@realtime_model`` declarations (``declarations``).
Importing this package registers them all."""

from realtime.checks import database, declarations, settings

__all__ = ["database", "declarations", "settings"]
