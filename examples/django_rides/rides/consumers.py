"""A consumer whose effects go through the ORM: ``python manage.py unilog_consume rides.consumers:totals --name t``.

It runs inside unilog's transaction (Django's own connection), so the totals and the checkpoint commit together."""

from decimal import Decimal

from django.db.models import F

from .models import Total


def totals(conn, records):
    name = records.consumer
    Total.objects.get_or_create(consumer=name)
    distance = sum((Decimal(r.data["distance"]) for r in records), Decimal(0))
    Total.objects.filter(consumer=name).update(distance=F("distance") + distance, rides=F("rides") + len(records))
