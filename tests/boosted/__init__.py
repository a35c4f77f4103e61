"""The example project with htmx-boosted pages, for tests/test_browser.py: a contacts page with
``{% realtime_script %}``, a page without it, links between them swapped in by ``hx-boost``."""
