"""Settings of the example project, read from the environment (and ``.env`` when present).

SQLite and the table transport by default, so it runs with no server at all; set
``DATABASE_URL`` (``postgres://...`` or ``mysql://...``) to use PostgreSQL or MariaDB.
"""

import os
from pathlib import Path

import environ

from realtime.conf import defaults as realtime_defaults

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
if (BASE_DIR / ".env").exists():
    env.read_env(BASE_DIR / ".env")

SECRET_KEY = env.str("SECRET_KEY", default="example-project-insecure-key-change-me")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "realtime",
    "example_project.crm",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "realtime.middleware.OriginMiddleware",
]

ROOT_URLCONF = "example_project.urls"
ASGI_APPLICATION = "example_project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'example.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the poller thread read while a request writes; IMMEDIATE transactions take
    # the write lock up front, so concurrent writers wait for each other instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        }
    )
    # Tests get a file too: the poller thread cannot share Django's in-memory test database.
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / "test_example.sqlite3")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "crm:home"
LOGOUT_REDIRECT_URL = "login"

# realtime: workspaces are the scope. Every REALTIME_* setting can be given in the environment
# (or .env) under its own name, read as the type of its default: REALTIME_TRANSPORT=redis with
# REALTIME_REDIS_URL=redis://127.0.0.1:6379/0, REALTIME_ALLOWED_ORIGINS (a comma-separated list
# of origins admitted besides ALLOWED_HOSTS), REALTIME_RECHECK_MODELS as JSON, and so on.
REALTIME_SCOPE_MODEL = "crm.Workspace"
_READ_AS = {bool: env.bool, int: env.int, float: env.float, list: env.list, dict: env.json}
for _name, _default in realtime_defaults().items():
    if _name in os.environ:
        _read = env.int if _name == "REALTIME_MAX_UNAUTHENTICATED_PER_ADDRESS" else None
        globals()[_name] = (_read or _READ_AS.get(type(_default), env.str))(_name)

# realtime's lines go to the console once: not propagated, since daphne gives the root logger
# a handler of its own (which would print each of them a second time).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)-8s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"realtime": {"handlers": ["console"], "level": "INFO", "propagate": False}},
}
