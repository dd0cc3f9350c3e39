"""Write ``tests/durations.json`` from the durations the last whole run recorded in ``.pytest_cache``.

The suite's lanes (``tests/conftest.py``) are spread by each test's known time. A checkout's own runs keep those
times in pytest's cache; a fresh clone, as the CI runs, has none and reads this committed file instead, so refresh it
after a whole run (``pytest -m ""``) when tests were added, renamed or got much slower or faster. Tests under half a
second are left out: they do not move a lane.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".pytest_cache" / "v" / "unilog" / "durations"
RECORDED = ROOT / "tests" / "durations.json"


def main() -> int:
    if not CACHE.exists():
        print(f"no durations recorded yet ({CACHE}): run the whole suite first", file=sys.stderr)
        return 2
    known: dict[str, float] = json.loads(CACHE.read_text())
    existing = {str(path.relative_to(ROOT)) for path in (ROOT / "tests").glob("test_*.py")}
    kept = {
        nodeid: round(seconds, 1)
        for nodeid, seconds in sorted(known.items())
        if seconds >= 0.5 and nodeid.partition("::")[0] in existing
    }
    RECORDED.write_text(json.dumps(kept, indent=0, sort_keys=True) + "\n")
    print(f"{len(kept)} tests' durations written to {RECORDED.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
