"""unilog's migrations up to unilog_0010 (a cheaper ``unilog_stage``), for projects that applied 0004 before."""

from __future__ import annotations

from django.db import migrations

from unilog.django import migrate_schema


class Migration(migrations.Migration):
    atomic = False  # unilog's migrations take their own lock and transaction
    dependencies = [("unilog", "0004_unilog_0009")]
    operations = [migrations.RunPython(migrate_schema, migrations.RunPython.noop, elidable=False)]
