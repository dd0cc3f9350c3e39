"""The ``unilog`` data source: a reader of one stream (:mod:`unilog.spark.source`) or of several
(:mod:`unilog.spark.streams`), as its options ask."""

from __future__ import annotations

from typing import Any

from .columns import SCHEMA
from .source import (
    SOURCE_NAME,
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    SourceOptions,
    UnilogBatchReader,
    UnilogStreamReader,
)
from .streams import UnilogStreamsBatchReader, UnilogStreamsReader


class UnilogDataSource(DataSource):
    """The ``unilog`` data source."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        options = SourceOptions.parse(self.options)
        return UnilogStreamsBatchReader(options) if options.many else UnilogBatchReader(options)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        options = SourceOptions.parse(self.options)
        return UnilogStreamsReader(options) if options.many else UnilogStreamReader(options)


def register(spark: Any) -> None:
    """Register the ``unilog`` data source with a SparkSession."""
    spark.dataSource.register(UnilogDataSource)
