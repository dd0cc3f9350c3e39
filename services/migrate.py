"""``python -m services.migrate``: unilog's migrations plus the demo's tables, idempotent (the release step)."""

from __future__ import annotations

import os
import sys

from sqlalchemy import create_engine

from unilog.config import sqlalchemy_url
from unilog.errors import UnilogError
from unilog.schema import migrate

from .rides import Base


def prepare(database_url: str) -> None:
    """Apply unilog's migrations and create the demo's tables if missing."""
    migrate(database_url)
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        Base.metadata.create_all(engine)
    finally:
        engine.dispose()


def main() -> int:
    try:
        prepare(os.environ.get("DATABASE_URL", ""))
    except UnilogError as exc:
        print(f"migrate: error: {exc}", file=sys.stderr)
        return 3
    print("migrate: database ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
