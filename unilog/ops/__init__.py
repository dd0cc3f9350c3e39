"""Operations: what an operator runs against a deployment, beside the long-running processes.

:mod:`~unilog.ops.status` (a deployment's state: ``unilog status``), :mod:`~unilog.ops.exporter` (that state as
Prometheus metrics: ``unilog metrics``), :mod:`~unilog.ops.dashboard` (the live web page), :mod:`~unilog.ops.admin`
(declaring and deleting consumers and groups, switching capture modes, loading handlers), :mod:`~unilog.ops.dlq`
(dead letters), :mod:`~unilog.ops.acl` (least-privilege Redis users) and :mod:`~unilog.ops.schema` (migrations).
The earlier names (``unilog.status``, ``unilog.admin``, ...) import the same modules. No room of the pipeline
imports this one (an import contract).
"""
