"""unilog's migrations up to unilog_0011 (table mode's claims and (stream, id) index), for projects that applied
0005 before."""

from __future__ import annotations

from django.db import migrations

from unilog.django import migrate_schema


class Migration(migrations.Migration):
    atomic = False  # unilog's migrations take their own lock and transaction
    dependencies = [("unilog", "0005_unilog_0010")]
    operations = [migrations.RunPython(migrate_schema, migrations.RunPython.noop, elidable=False)]
