"""``python manage.py unilog_consume app.module:handler --name NAME``: a :class:`unilog.django.DjangoConsumer`.

Redis comes from ``--redis-url``, else ``settings.UNILOG_REDIS_URL``, else ``$REDIS_URL``; the stream from
``--stream``, ``settings.UNILOG_STREAM`` or ``$UNILOG_STREAM``. ``--once`` is burst mode; otherwise it runs until
SIGTERM or SIGINT, finishing the batch in progress.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from unilog.consume.consumer import ConsumerConfig
from unilog.consume.records import load_handler
from unilog.errors import UnilogError


class Command(BaseCommand):
    help = "Run a unilog checkpoint consumer whose handler writes through the Django ORM in unilog's transaction."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("handler", help="package.module:function, called as handler(conn, records)")
        parser.add_argument("--name", required=True, help="the consumer's name (its checkpoint)")
        parser.add_argument("--stream")
        parser.add_argument("--redis-url")
        parser.add_argument("--database", default="default", help="the Django database alias")
        parser.add_argument("--batch-size", type=int, default=1000)
        parser.add_argument("--once", action="store_true", help="consume what is there, then exit")

    def handle(self, *args: Any, **options: Any) -> None:
        from unilog.django import DjangoConsumer

        redis_url = options["redis_url"] or getattr(settings, "UNILOG_REDIS_URL", None) or os.environ.get("REDIS_URL")
        if not redis_url:
            raise CommandError("give --redis-url, settings.UNILOG_REDIS_URL or $REDIS_URL")
        stream = options["stream"] or getattr(settings, "UNILOG_STREAM", None) or os.environ.get("UNILOG_STREAM")
        try:
            config = ConsumerConfig(name=options["name"], stream=stream, batch_size=options["batch_size"])
            consumer = DjangoConsumer(
                config, load_handler(options["handler"]), redis_url=redis_url, using=options["database"]
            )
            with consumer:
                if options["once"]:
                    count = consumer.drain()
                    self.stdout.write(f"unilog: consumer {options['name']} handled {count} records")
                    return
                stop = threading.Event()
                signal.signal(signal.SIGTERM, lambda *_: stop.set())
                signal.signal(signal.SIGINT, lambda *_: stop.set())
                consumer.run(stop)
        except (UnilogError, ValueError) as exc:
            raise CommandError(str(exc)) from None
