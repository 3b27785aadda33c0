"""Where this process is: its main thread's Python stack, asked for by the operator when the heartbeat stops.

The metrics server answers ``GET /stacks`` (:data:`STACKS_PATH`) on its own thread, which runs while the main
thread waits in a collective, sleeps or does I/O (all of which let go of the interpreter); a rank stuck in
native code that holds it cannot answer, and the operator says so. Each answer is also printed to this
process's stderr, so the pod's log keeps it while the pod lives. Neither torch nor the operator is imported.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import traceback
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["MAX_FRAMES", "STACKS_PATH", "main_thread_stack", "stacks_answer"]

STACKS_PATH: Final = "/stacks"
# The innermost frames kept: where a rank waits is at the bottom of its stack, and the operator keeps little.
MAX_FRAMES: Final = 40


def main_thread_stack(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """This process's rank, pod and pid, and its main thread's frames, outermost first."""
    env = os.environ if env is None else env
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    frames = traceback.extract_stack(frame)[-MAX_FRAMES:] if frame is not None else []
    return {
        "rank": int(env.get("RANK", "0")),
        "localRank": int(env.get("LOCAL_RANK", "0")),
        "pod": env.get("KUBETRAIN_POD_NAME") or socket.gethostname(),
        "pid": os.getpid(),
        "frames": [[f.filename, f.lineno or 0, f.name] for f in frames],
    }


def stacks_answer() -> bytes:
    """The JSON body of ``GET /stacks``; the same stack goes to stderr, the pod's log."""
    stack = main_thread_stack()
    lines = "".join(f"  File \"{file}\", line {line}, in {name}\n" for file, line, name in stack["frames"])
    print(f"kubetrain-trainer: stack of rank {stack['rank']} (pid {stack['pid']}), asked for by the operator "
          f"after the heartbeat stopped:\n{lines}", file=sys.stderr, end="", flush=True)
    return json.dumps(stack).encode("utf-8")
