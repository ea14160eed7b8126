"""A long-lived worker process for math-verify checks requested off the main thread (see ``extraction.py``).

Protocol: one JSON array ``[candidate, truth, timeout_seconds]`` per line on stdin, one line ``1`` or ``0`` on
stdout. The worker runs on its own main thread, so math-verify's ``signal.alarm`` timeouts work here; a check that
hangs anyway (a C-level computation) is ended by the parent killing this process.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    protocol = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not corrupt the protocol
    from agentic_rl.rewards.extraction import _math_verify_compare

    for line in sys.stdin:
        try:
            candidate, truth, timeout = json.loads(line)
            ok = _math_verify_compare(str(candidate), str(truth), int(timeout))
        except Exception:  # noqa: BLE001 - a failed comparison is "not verified"
            ok = False
        protocol.write("1\n" if ok else "0\n")
        protocol.flush()


if __name__ == "__main__":
    main()
