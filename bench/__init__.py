"""unilog benchmarks: ``python -m bench`` (full) or ``python -m bench --quick``.

Real servers (``unilog.harness.embedded``: Postgres with fsync on, Redis with ``appendonly yes``/``appendfsync
always``), each workload's variants run interleaved (A B C A B C ...), a table of medians and ranges, the target
ratios with PASS/MISS, and a JSON file with every trial and the machine's description.
"""
