"""The shop's tables: ``orders``, written by the API, and ``sales``, the consumer's running totals."""

from __future__ import annotations

from sqlalchemy import Engine, Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    product: Mapped[str] = mapped_column(String(100))
    quantity: Mapped[int] = mapped_column(Integer)


class Sale(Base):
    """How many of each product were sold: the consumer keeps it up to date."""

    __tablename__ = "sales"

    product: Mapped[str] = mapped_column(String(100), primary_key=True)
    sold: Mapped[int] = mapped_column(Integer)


def create_tables(engine: Engine) -> None:
    Base.metadata.create_all(engine)
