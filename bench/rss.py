"""``python -m bench.rss MODULE ARGS...``: run ``python -m MODULE ARGS...`` and, at exit, write this process's peak
RSS (``VmHWM`` of ``/proc/self/status``, in kB) to the file named by ``$BENCH_RSS_FILE``.

Needed because the parent cannot read it afterwards: ``/proc/<pid>`` is gone, and ``wait4``'s ``ru_maxrss`` also
counts the parent's memory that the child shared before ``exec`` (vfork/fork), which hides a small child.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys
from pathlib import Path


def _write_peak() -> None:
    target = os.environ.get("BENCH_RSS_FILE")
    if not target:
        return
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            Path(target).write_text(line.split()[1])


def main() -> None:
    module, sys.argv = sys.argv[1], sys.argv[1:]
    atexit.register(_write_peak)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
