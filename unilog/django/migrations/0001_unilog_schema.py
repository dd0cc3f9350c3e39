"""unilog's own migrations (Alembic, ``unilog migrate``), run by ``python manage.py migrate``.

They run on a connection of their own and commit before Django records this migration; both are idempotent, so a
failure between the two is repaired by running ``migrate`` again. Later unilog releases add migrations here that
run the same command, so ``manage.py migrate`` keeps the schema at the installed unilog's head.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def upgrade(apps: Any, schema_editor: Any) -> None:
    from unilog.django import database_url
    from unilog.schema import migrate

    migrate(database_url(schema_editor.connection.alias))


class Migration(migrations.Migration):
    initial = True
    atomic = False  # unilog's migrations take their own lock and transaction
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(upgrade, migrations.RunPython.noop, elidable=False)]
