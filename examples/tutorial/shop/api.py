"""The shop's HTTP API: ``POST /orders`` saves an order and emits its ``OrderCreated`` record in one transaction."""

from __future__ import annotations

import os

from fastapi import FastAPI
from pydantic import BaseModel, Field
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import unilog
from unilog.config import sqlalchemy_url

from .models import Order, create_tables
from .records import OrderCreated


class NewOrder(BaseModel):
    product: str = Field(min_length=1, max_length=100)
    quantity: int = Field(gt=0)


def create_app(database_url: str | None = None) -> FastAPI:
    url = database_url or os.environ["DATABASE_URL"]
    engine = create_engine(sqlalchemy_url(url))  # postgresql+psycopg://, the driver unilog uses
    create_tables(engine)
    app = FastAPI()
    app.state.engine = engine

    @app.post("/orders", status_code=201)
    def place_order(new: NewOrder) -> dict[str, int]:
        with Session(engine) as session, session.begin():
            order = Order(product=new.product, quantity=new.quantity)
            session.add(order)
            session.flush()  # gives the order its id
            order_id = order.id
            record = OrderCreated(id=order_id, product=order.product, quantity=order.quantity)
            unilog.emit(session, record, key=f"order-{order_id}")
        # committed: the order and its record together. Had anything raised, neither would exist.
        return {"id": order_id}

    return app
