"""unilog's migrations up to unilog_0008 (the backfills' cursors, ``unilog_backfills``), for projects that applied
0002 before."""

from __future__ import annotations

from django.db import migrations

from unilog.django import migrate_schema


class Migration(migrations.Migration):
    atomic = False  # unilog's migrations take their own lock and transaction
    dependencies = [("unilog", "0002_unilog_0007")]
    operations = [migrations.RunPython(migrate_schema, migrations.RunPython.noop, elidable=False)]
