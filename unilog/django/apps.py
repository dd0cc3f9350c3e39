"""The Django app ``unilog.django``: its migration creates unilog's tables (see the package docstring)."""

from __future__ import annotations

from django.apps import AppConfig


class UnilogConfig(AppConfig):
    name = "unilog.django"
    label = "unilog"
    verbose_name = "unilog (transactional outbox)"
    default_auto_field = "django.db.models.BigAutoField"
