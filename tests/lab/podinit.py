"""The container's first process, run as ``ip netns exec NS unshare --uts -- python podinit.py SPEC``.

`ip netns exec` has already entered the pod's network namespace and a private mount namespace with
/etc/netns/NS/{hosts,resolv.conf} bound over /etc; `unshare --uts` gave a private hostname. This sets the
hostname, mounts the pod's volumes at their mountPaths (visible to this container only), then execs the
container's command with its environment. Standard library only: it runs before any venv is chosen.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys


def _mount(mount: dict[str, object]) -> None:
    target = str(mount["target"])
    if not mount.get("file"):
        os.makedirs(target, exist_ok=True)
    if mount.get("tmpfs"):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", target], check=True)
    else:
        subprocess.run(["mount", "--bind", str(mount["source"]), target], check=True)
    if mount.get("readOnly"):
        subprocess.run(["mount", "-o", "remount,bind,ro", target], check=True)


def main() -> None:
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    socket.sethostname(spec["hostname"])
    for mount in spec["mounts"]:
        _mount(mount)
    os.chdir(spec["workingDir"])
    argv = spec["argv"]
    try:
        os.execvpe(argv[0], argv, spec["env"])
    except OSError as error:
        # Like a runtime's StartError: say why on the container's output, exit 128.
        print(f"lab: cannot exec {argv[0]!r}: {error}", file=sys.stderr, flush=True)
        sys.exit(128)


if __name__ == "__main__":
    main()
