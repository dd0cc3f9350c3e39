"""unilog's migrations up to unilog_0007 (WAL capture's ``unilog_capture``, the quiet wake-up), for projects that
applied 0001 before."""

from __future__ import annotations

from django.db import migrations

from unilog.django import migrate_schema


class Migration(migrations.Migration):
    atomic = False  # unilog's migrations take their own lock and transaction
    dependencies = [("unilog", "0001_unilog_schema")]
    operations = [migrations.RunPython(migrate_schema, migrations.RunPython.noop, elidable=False)]
