"""unilog's migrations up to unilog_0009 (records as logical messages in WAL capture mode, ``unilog_emit``), for
projects that applied 0003 before."""

from __future__ import annotations

from django.db import migrations

from unilog.django import migrate_schema


class Migration(migrations.Migration):
    atomic = False  # unilog's migrations take their own lock and transaction
    dependencies = [("unilog", "0003_unilog_0008")]
    operations = [migrations.RunPython(migrate_schema, migrations.RunPython.noop, elidable=False)]
