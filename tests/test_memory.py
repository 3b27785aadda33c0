"""The operator hands memory it freed back to the OS (kubetrain.controller.memory), in a fresh process."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import psutil
from kubetrain.controller.memory import return_freed_memory
process = psutil.Process()
chunks = [bytes(2048) + bytes([i % 256]) for i in range(100_000)]  # ~200 MiB in glibc's heap, as watch events are
keep = chunks[-1]
del chunks
before = process.memory_info().rss
return_freed_memory()
after = process.memory_info().rss
print(before // 2**20, after // 2**20)
"""


def test_freed_memory_goes_back_to_the_os() -> None:
    output = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    before, after = map(int, output.split())
    assert before - after > 100, f"RSS {before} MiB before the trim, {after} MiB after"
