"""``python -m tests.lab build | images | up [--nodes N --gpus-per-node G --real-node --kueue --gang --kwok-nodes N]
| down | serve``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.lab.build import ensure_all
from tests.lab.lab import LAB_HOME, STATE_FILE, Lab, cleanup_stale
from tests.lab.procs import kill_tree

UP_DIR = LAB_HOME / "up"
READY_FILE = "ready"
UP_TIMEOUT_S = 180
# A real node imports the project's images into its containerd (the trainer's is gigabytes).
REAL_NODE_UP_TIMEOUT_S = 1200
# Simulated nodes are created and made Ready at well over this rate, even on 2 cores.
KWOK_NODES_PER_S = 20


def _serve(args: argparse.Namespace) -> None:
    """Run a lab in the foreground until SIGTERM/SIGINT (what `up` starts in the background)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    run_dir = Path(args.run_dir)
    with Lab(run_dir, nodes=args.nodes, gpus_per_node=args.gpus_per_node, real_node=args.real_node,
             kueue=args.kueue, gang=args.gang, kwok_nodes=args.kwok_nodes) as lab:
        (run_dir / READY_FILE).write_text(str(lab.kubeconfig))
        stopping.wait()
    (run_dir / READY_FILE).unlink(missing_ok=True)


def _up(args: argparse.Namespace) -> int:
    if (UP_DIR / STATE_FILE).exists():
        print(f"a lab is already up (see {UP_DIR}); run `python -m tests.lab down` first", file=sys.stderr)
        return 1
    ensure_all()  # in the foreground, so that a cold build shows its progress here
    if args.real_node:
        from tests.lab.oci import ensure_images

        ensure_images()
    UP_DIR.mkdir(parents=True, exist_ok=True)
    (UP_DIR / READY_FILE).unlink(missing_ok=True)
    argv = [sys.executable, "-m", "tests.lab", "serve", "--run-dir", str(UP_DIR),
            "--nodes", str(args.nodes), "--gpus-per-node", str(args.gpus_per_node),
            *(["--real-node"] if args.real_node else []), *(["--kueue"] if args.kueue else []),
            *(["--gang"] if args.gang else []), "--kwok-nodes", str(args.kwok_nodes)]
    with (UP_DIR / "lab.log").open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=Path(__file__).resolve().parents[2])
    (UP_DIR / "serve.pid").write_text(str(proc.pid))
    deadline = (time.monotonic() + (REAL_NODE_UP_TIMEOUT_S if args.real_node else UP_TIMEOUT_S)
                + args.kwok_nodes / KWOK_NODES_PER_S)
    while not (UP_DIR / READY_FILE).exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            print(f"the lab did not come up; see {UP_DIR / 'lab.log'}", file=sys.stderr)
            kill_tree(proc.pid)
            return 1
        time.sleep(0.5)
    kubeconfig = (UP_DIR / READY_FILE).read_text()
    print(kubeconfig)
    print(f"export KUBECONFIG={kubeconfig}   # kubectl: {ensure_all()['kubectl']}", file=sys.stderr)
    return 0


def _down(_args: argparse.Namespace) -> int:
    pid_file = UP_DIR / "serve.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        try:
            os.kill(pid, signal.SIGTERM)
            for _ in range(240):  # a graceful stop takes a few seconds; give up after 2 min
                os.kill(pid, 0)
                time.sleep(0.5)
            kill_tree(pid, grace=1)
        except ProcessLookupError:
            pass
        pid_file.unlink(missing_ok=True)
    cleanup_stale()  # whatever a crashed lab (ours or a killed pytest's) left behind
    print("lab down", file=sys.stderr)
    return 0


def _build(_args: argparse.Namespace) -> int:
    for name, path in ensure_all().items():
        print(f"{name}: {path}")
    return 0


def _images(_args: argparse.Namespace) -> int:
    from tests.lab.oci import ensure_images

    for name, path in ensure_images().items():
        print(f"{name}: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build the missing binaries into the cache")
    sub.add_parser("images", help="build the operator and trainer images from their Dockerfiles (cached)")
    for name in ("up", "serve"):
        helptext = "start a lab in the background" if name == "up" else argparse.SUPPRESS
        command = sub.add_parser(name, help=helptext)
        command.add_argument("--nodes", type=int, default=2)
        command.add_argument("--gpus-per-node", type=int, default=0)
        command.add_argument("--real-node", action="store_true",
                             help="also run a real kubelet + containerd node with the project's images")
        command.add_argument("--kueue", action="store_true",
                             help="also run Kueue's controller manager with its CRDs and webhooks")
        command.add_argument("--gang", action="store_true",
                             help="serve scheduling.k8s.io/v1beta1 PodGroups (Kubernetes' own gang scheduling)")
        command.add_argument("--kwok-nodes", type=int, default=0, metavar="N",
                             help="also N simulated nodes of 8 GPUs each, played by kwok (no processes)")
        if name == "serve":
            command.add_argument("--run-dir", required=True)
    sub.add_parser("down", help="stop the lab started by `up` and clean up after crashed labs")
    args = parser.parse_args(argv)
    if args.command == "serve":
        _serve(args)
        return 0
    handlers = {"build": _build, "images": _images, "up": _up, "down": _down}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
