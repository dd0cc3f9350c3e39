"""The example's own tests, on real servers: ``DATABASE_URL`` (Django creates and drops a test database there) and
``REDIS_URL`` (a throw-away Redis). ``python manage.py test rides``.

TransactionTestCase, not TestCase: these tests are about what commits, so nothing may wrap them in a transaction.
"""

import io
import json
import uuid
from decimal import Decimal

import psycopg
from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction
from django.test import TransactionTestCase

from unilog import ConsumerConfig, Faults, InjectedCrash, NotInTransaction, PayloadNotSerializable, Settings, Streamer
from unilog.django import DjangoConsumer, database_url, emit, emit_many

from .consumers import totals
from .models import Ride, Total


def staged() -> list:
    with connection.cursor() as cursor:
        cursor.execute("SELECT data::text FROM staged_log_records ORDER BY id")
        return [json.loads(row[0]) for row in cursor.fetchall()]


def empty_unilogs_tables() -> None:
    """unilog's tables are not Django models: TransactionTestCase does not empty them between tests."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM staged_log_records")
        cursor.execute("DELETE FROM unilog_checkpoints")


class EmitTests(TransactionTestCase):
    def setUp(self) -> None:
        empty_unilogs_tables()

    def test_a_committed_block_stages_its_record(self) -> None:
        with transaction.atomic():
            emit(action="create", object="ride", data={"n": 1})
        self.assertEqual(staged(), [{"n": 1}])

    def test_a_rolled_back_block_and_a_rolled_back_savepoint_stage_nothing(self) -> None:
        with self.assertRaises(LookupError), transaction.atomic():
            emit(action="create", object="ride", data={"n": 1})
            raise LookupError
        with transaction.atomic():
            emit(action="create", object="ride", data={"n": 2})
            try:
                with transaction.atomic():  # a savepoint
                    emit(action="create", object="ride", data={"n": 3})
                    raise LookupError
            except LookupError:
                pass
        self.assertEqual(staged(), [{"n": 2}])

    def test_outside_atomic_it_is_refused_and_bad_input_leaves_the_block_usable(self) -> None:
        with self.assertRaises(NotInTransaction):
            emit(action="create", object="ride", data={"n": 1})
        with transaction.atomic():
            with self.assertRaises(PayloadNotSerializable):
                emit(action="create", object="ride", data={"when": object()})
            Ride.objects.create(distance=Decimal("1.5"))
            emit(action="create", object="ride", data={"n": 4})
        self.assertEqual(staged(), [{"n": 4}])
        self.assertEqual(Ride.objects.count(), 1)

    def test_emit_many_stages_in_order_in_the_block_and_refuses_naming_the_bad_record(self) -> None:
        records = [{"action": "create", "object": "ride", "data": {"n": n}} for n in (3, 1, 2)]
        with self.assertRaises(NotInTransaction):
            emit_many(records)
        with transaction.atomic():
            self.assertEqual(emit_many([]), [])
            with self.assertRaisesRegex(PayloadNotSerializable, r"^records\[1\]: data\['when'\]"):
                emit_many([records[0], {**records[0], "data": {"when": object()}}])
            ids = emit_many(records)
        self.assertEqual(len(ids), 3)
        self.assertEqual(ids, sorted(ids))
        self.assertEqual(staged(), [{"n": 3}, {"n": 1}, {"n": 2}])

    def test_model_values_are_encoded_by_the_documented_rules_and_a_default_encoder(self) -> None:
        ref = uuid.uuid4()
        with transaction.atomic():
            ride = Ride.objects.create(distance=Decimal("12.5"))
            ride.refresh_from_db()  # a DecimalField as the database gives it: Decimal('12.500')
            emit(
                action="create",
                object="ride",
                data={"ride": ride, "distance": ride.distance, "ref": ref, "raw": b"\x00\xff"},
                default=lambda obj: {"id": obj.pk, "distance": obj.distance} if isinstance(obj, Ride) else str(obj),
            )
        [data] = staged()
        self.assertEqual(data["distance"], "12.500")  # a string: exact
        self.assertEqual(data["ride"], {"id": ride.pk, "distance": "12.500"})  # the rules apply to what it returns
        self.assertEqual((uuid.UUID(data["ref"]), data["raw"]), (ref, "AP8="))


class ConsumerTests(TransactionTestCase):
    def setUp(self) -> None:
        empty_unilogs_tables()
        self.stream = f"rides-{uuid.uuid4().hex[:8]}"
        self.settings = Settings(database_url=database_url(), redis_url=settings.UNILOG_REDIS_URL, stream=self.stream)

    def post(self, distance: str) -> int:
        with self.settings_override():
            response = self.client.post("/rides", {"distance": distance}, content_type="application/json")
        self.assertEqual(response.status_code, 201, response.content)
        return response.json()["ride"]["id"]

    def settings_override(self):  # the view stages on settings.UNILOG_STREAM: this test's own stream
        from django.test import override_settings

        return override_settings(UNILOG_STREAM=self.stream)

    def consumer(self, faults: Faults | None = None) -> DjangoConsumer:
        config = ConsumerConfig(name="totals", batch_size=2)
        return DjangoConsumer(config, totals, redis_url=settings.UNILOG_REDIS_URL, stream=self.stream,
                              faults=faults or Faults())

    def test_the_orm_writes_and_the_checkpoint_commit_together_once(self) -> None:
        for distance in ("1.5", "2.25", "3", "4"):
            self.post(distance)
        with Streamer(self.settings) as streamer:
            self.assertEqual(streamer.drain(), 4)
        faults = Faults.scripted(consumer__crash_before_commit=[False, True])
        consumer = self.consumer(faults)
        with self.assertRaises(InjectedCrash):
            consumer.drain()  # the second batch crashes before its commit: its ORM writes roll back
        self.assertEqual(Total.objects.get(consumer="totals").rides, 2)
        consumer.close()
        with self.consumer() as again:
            self.assertEqual(again.drain(), 2)
        total = Total.objects.get(consumer="totals")
        self.assertEqual((total.rides, total.distance), (4, Decimal("10.750")))

    def test_a_double_sent_batch_is_applied_once(self) -> None:
        self.post("5")
        with Streamer(self.settings, faults=Faults.scripted(streamer__double_send=[True])) as streamer:
            streamer.drain()
        with self.consumer() as consumer:
            self.assertEqual(consumer.drain(), 1)
            self.assertEqual(consumer.skipped_total, 1)
        self.assertEqual(Total.objects.get(consumer="totals").rides, 1)

    def test_the_management_command_consumes_in_burst_mode(self) -> None:
        self.post("2.5")
        self.post("0.5")
        with Streamer(self.settings) as streamer:
            streamer.drain()
        out = io.StringIO()
        call_command("unilog_consume", "rides.consumers:totals", "--name", "cmd", "--stream", self.stream, "--once",
                     stdout=out)
        self.assertIn("handled 2 records", out.getvalue())
        total = Total.objects.get(consumer="cmd")
        self.assertEqual((total.rides, total.distance), (2, Decimal("3.000")))

    def test_unilogs_tables_came_from_djangos_migrations(self) -> None:
        with psycopg.connect(database_url()) as conn:
            tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        self.assertLessEqual({"staged_log_records", "unilog_checkpoints", "rides_ride", "rides_total"}, tables)
