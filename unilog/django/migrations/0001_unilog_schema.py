"""unilog's own migrations (Alembic, ``unilog migrate``), run by ``python manage.py migrate``.

They run on a connection of their own and commit before Django records this migration; both are idempotent, so a
failure between the two is repaired by running ``migrate`` again. Later unilog releases add migrations here that
run the same command, so ``manage.py migrate`` keeps the schema at the installed unilog's head.
"""

from __future__ import annotations

from django.db import migrations

from unilog.django import migrate_schema


class Migration(migrations.Migration):
    initial = True
    atomic = False  # unilog's migrations take their own lock and transaction
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(migrate_schema, migrations.RunPython.noop, elidable=False)]
