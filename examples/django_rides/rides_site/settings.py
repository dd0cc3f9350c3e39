"""Settings of the example: the database from ``DATABASE_URL``, Redis from ``REDIS_URL`` (read here, the entry
point), and ``unilog.django`` installed so ``manage.py migrate`` creates unilog's tables."""

import os
from urllib.parse import parse_qs, unquote, urlsplit

SECRET_KEY = "example-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "rides_site.urls"
USE_TZ = True
INSTALLED_APPS = ["unilog.django", "rides"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def _database(url: str) -> dict:
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or query.get("host", [""])[0],
        "PORT": str(parts.port or query.get("port", [""])[0]),
    }


DATABASES = {"default": _database(os.environ.get("DATABASE_URL", "postgresql://localhost/rides"))}
UNILOG_REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
UNILOG_STREAM = "django-rides"
