"""The process's last words: one JSON line in the Kubernetes termination message, read by the operator.

Written by local rank 0 only (one per pod). ``KUBETRAIN_TERMINATION_LOG`` overrides the path (``kubetrain
run`` and tests); without it, the file is written only where Kubernetes mounted ``/dev/termination-log``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

__all__ = ["TERMINATION_LOG_ENV", "write_termination_message"]

TERMINATION_LOG_ENV: Final = "KUBETRAIN_TERMINATION_LOG"
# Kubernetes keeps at most 4 KiB of the file: the free-text message is cut well below that.
MAX_MESSAGE_CHARS: Final = 2000


def write_termination_message(record: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> None:
    """Write ``record`` as the termination message, if this is local rank 0 and someone will read it."""
    if int(env.get("LOCAL_RANK", "0")) != 0:
        return
    override = env.get(TERMINATION_LOG_ENV)
    path = Path(override or "/dev/termination-log")
    if not override and not path.exists():
        return  # not in a Kubernetes container: nothing would read it
    short = {**record, "message": str(record.get("message", ""))[:MAX_MESSAGE_CHARS]}
    path.write_text(json.dumps(short) + "\n", encoding="utf-8")
