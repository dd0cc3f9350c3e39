"""unilog's migrations up to unilog_0013 (record contracts: the record type and the schema registry), for projects
that applied 0007 before."""

from __future__ import annotations

from django.db import migrations

from unilog.django import migrate_schema


class Migration(migrations.Migration):
    atomic = False  # unilog's migrations take their own lock and transaction
    dependencies = [("unilog", "0007_unilog_0012")]
    operations = [migrations.RunPython(migrate_schema, migrations.RunPython.noop, elidable=False)]
