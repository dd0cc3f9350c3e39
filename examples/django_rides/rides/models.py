from django.db import models


class Ride(models.Model):
    distance = models.DecimalField(max_digits=14, decimal_places=3)


class Total(models.Model):
    """A consumer's derived state, written through the ORM in unilog's transaction."""

    consumer = models.TextField(primary_key=True)
    distance = models.DecimalField(max_digits=20, decimal_places=3, default=0)
    rides = models.BigIntegerField(default=0)
