"""The example project's settings, with the boosted pages' URLs and templates."""

from pathlib import Path

from example_project.settings import *  # noqa: F403
from example_project.settings import TEMPLATES

TEMPLATES[0]["DIRS"] = [Path(__file__).resolve().parent / "templates"]
ROOT_URLCONF = "tests.boosted.urls"
