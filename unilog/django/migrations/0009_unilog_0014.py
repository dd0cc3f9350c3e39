"""unilog's migrations up to unilog_0014 (WAL capture's recovery of a lost slot: the slot's last restart position
and the record of each loss), for projects that applied 0008 before."""

from __future__ import annotations

from django.db import migrations

from unilog.django import migrate_schema


class Migration(migrations.Migration):
    atomic = False  # unilog's migrations take their own lock and transaction
    dependencies = [("unilog", "0008_unilog_0013")]
    operations = [migrations.RunPython(migrate_schema, migrations.RunPython.noop, elidable=False)]
