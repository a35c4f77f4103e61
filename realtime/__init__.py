"""realtime: tell WebSocket clients about the model writes they may read, after commit.

Importing this package is safe from ``models.py``: nothing here touches the database or
reads settings.
"""
