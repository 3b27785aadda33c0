"""The container's first process, run as ``ip netns exec NS unshare --uts -- python podinit.py SPEC``.

`ip netns exec` has already entered the pod's network namespace and a private mount namespace with
/etc/netns/NS/{hosts,resolv.conf} bound over /etc; `unshare --uts` gave a private hostname. This sets the
hostname, mounts the container's own /tmp and the pod's volumes at their mountPaths (visible to this container
only), then execs the container's command with its environment. Standard library only: it runs before any
venv is chosen.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys


def _mount(mount: dict[str, object], source: int | None) -> None:
    """``source``: a handle on the source opened before any mount, so that a source below /tmp (a lab home or a
    hostPath there) is still reached once the container's own /tmp covers the machine's."""
    target = str(mount["target"])
    if not mount.get("file"):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):  # below the container's /tmp: the host has no mountpoint for it
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    if source is None:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", target], check=True)
    else:  # not canonicalized: mount(8) would turn the handle back into the path it came from
        subprocess.run(["mount", "--no-canonicalize", "--bind", f"/proc/self/fd/{source}", target], check=True,
                       pass_fds=(source,))
    if mount.get("readOnly"):
        subprocess.run(["mount", "-o", "remount,bind,ro", target], check=True)


def main() -> None:
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    socket.sethostname(spec["hostname"])
    sources = [None if mount.get("tmpfs") else os.open(str(mount["source"]), os.O_PATH)
               for mount in spec["mounts"]]
    for mount, source in zip(spec["mounts"], sources, strict=True):
        _mount(mount, source)
        if source is not None:
            os.close(source)
    os.makedirs(spec["workingDir"], exist_ok=True)  # as a runtime does for a missing workingDir
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
