"""System checks: of the ``REALTIME_*`` settings (``settings``) and of ``@realtime_model``
declarations (``declarations``). Importing this package registers both."""

from realtime.checks import declarations, settings

__all__ = ["declarations", "settings"]
