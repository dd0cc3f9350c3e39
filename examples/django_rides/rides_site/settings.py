"""Settings of the example: the database from ``DATABASE_URL``, Redis from ``REDIS_URL`` (read here, the entry
point), and ``unilog.django`` installed so ``manage.py migrate`` creates unilog's tables."""

import os

from psycopg.conninfo import conninfo_to_dict

SECRET_KEY = "example-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "rides_site.urls"
USE_TZ = True
INSTALLED_APPS = ["unilog.django", "rides"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def _database(url: str) -> dict:
    """Django's settings for any URL libpq takes, host lists (``postgresql://u@db1:5432,db2:5432/rides``) and
    ``target_session_attrs`` included: libpq parses it, the rest of its parameters go to ``OPTIONS``."""
    params = conninfo_to_dict(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.pop("dbname", None) or "postgres",
        "USER": params.pop("user", ""),
        "PASSWORD": params.pop("password", ""),
        "HOST": params.pop("host", ""),
        "PORT": str(params.pop("port", "")),
        "OPTIONS": params,
    }


DATABASES = {"default": _database(os.environ.get("DATABASE_URL", "postgresql://localhost/rides"))}
UNILOG_REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
UNILOG_STREAM = "django-rides"
