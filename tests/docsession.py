"""One Python session for a doc's python blocks, run as a process of its own.

Reads one JSON line per block (``{"code": ..., "where": "docs/x.md:12"}``) from stdin, runs it in
one shared namespace (as a reader typing the blocks in order into one interpreter would), and
answers one JSON line on stdout: ``{"ok": true}`` or ``{"ok": false, "error": traceback}``. What
the blocks print goes to stderr, so it never mixes with the answers.
"""

from __future__ import annotations

import contextlib
import json
import sys
import traceback
from typing import Any


def main() -> None:
    answers = sys.stdout
    scope: dict[str, Any] = {"__name__": "__main__"}
    for line in sys.stdin:
        request = json.loads(line)
        try:
            with contextlib.redirect_stdout(sys.stderr):
                exec(compile(request["code"], request["where"], "exec"), scope)
            answer: dict[str, Any] = {"ok": True}
        except BaseException:  # every failure of a doc block is reported; none ends the session
            answer = {"ok": False, "error": traceback.format_exc()}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
