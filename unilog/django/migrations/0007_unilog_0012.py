"""unilog's migrations up to unilog_0012 (WAL capture's hold to rows), for projects that applied 0006 before."""

from __future__ import annotations

from django.db import migrations

from unilog.django import migrate_schema


class Migration(migrations.Migration):
    atomic = False  # unilog's migrations take their own lock and transaction
    dependencies = [("unilog", "0006_unilog_0011")]
    operations = [migrations.RunPython(migrate_schema, migrations.RunPython.noop, elidable=False)]
