"""The lab's default StorageClass and its dynamic provisioner: hostPath volumes under the run directory.

kind and minikube bind a bare PersistentVolumeClaim at once because their default class provisions local
directories; this module gives the lab the same. It works like an external provisioner (and like Rancher's
local-path-provisioner): the DefaultStorageClass admission plugin fills in ``storageClassName``, the PV
controller annotates the claim with our provisioner's name, we create a PersistentVolume pre-bound to the
claim (``claimRef`` with its uid) and the PV controller binds the two. When the claim is deleted the PV turns
Released and, with reclaim policy Delete, we remove its directory and then the PV.

Two threads (claims, volumes), each list + watch with resourceVersion, re-list after 410 or a disconnect,
and reconcile every object they see, so a missed event is made up on the next list. API errors are logged
and retried with backoff; the threads only end in :meth:`Provisioner.stop`.
"""

from __future__ import annotations

import datetime
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests

from tests.lab.rest import JSON, ApiError, Rest

log = logging.getLogger(__name__)

STORAGE_CLASS = "lab-local"
PROVISIONER = "kubetrain.dev/lab-local"
ANN_PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
# Set on a claim by the PV controller once it decided that this provisioner must create its volume.
ANN_STORAGE_PROVISIONER = ("volume.kubernetes.io/storage-provisioner",
                           "volume.beta.kubernetes.io/storage-provisioner")
CLASS_PATH = "/apis/storage.k8s.io/v1/storageclasses"
WATCH_WINDOW_S = 5  # short watches so that stop() is prompt; resumed from the last resourceVersion
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 5.0  # a lab recovers from an apiserver restart in seconds; so should we
ORPHAN_GRACE_S = 60  # a directory is made just before its PV: never collect one that young
# Trainer pods run as uid 1000 on a real kubelet: everyone may write, as with local-path-provisioner.
VOLUME_MODE = 0o777

Handler = Callable[[Rest, str, JSON], None]


def storage_class() -> JSON:
    return {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS,
                     "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": PROVISIONER, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
    }


def volume_name(claim: JSON) -> str:
    """Deterministic, as external provisioners do: a retry finds the PV it already made (409)."""
    return f"pvc-{claim['metadata']['uid']}"


class Provisioner:
    def __init__(self, rest: Callable[[], Rest], run_dir: Path) -> None:
        self.rest = rest
        self.root = run_dir / "storage"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._failure_reported: set[str] = set()  # claim uids told once why they are not provisioned

    # lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Create the default StorageClass (before any claim can miss it), then start the watches."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # pods running as another user must be able to reach their directory
        try:
            self.rest().post(CLASS_PATH, storage_class())
        except ApiError as error:
            if error.status != 409:
                raise
        loops = (("/api/v1/persistentvolumeclaims", self._on_claim, None, "lab-provisioner-claims"),
                 ("/api/v1/persistentvolumes", self._on_volume, self._collect_orphans, "lab-provisioner-volumes"))
        for path, handler, after_list, name in loops:
            thread = threading.Thread(target=self._list_and_watch, args=(path, handler, after_list), name=name,
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=WATCH_WINDOW_S + 20)

    def _list_and_watch(self, path: str, handler: Handler, after_list: Callable[[list[JSON]], None] | None) -> None:
        """Reconcile every listed object, then every watch event; on any error back off and list again."""
        api = self.rest()  # one client per thread: its watch holds a connection
        backoff = BACKOFF_FIRST_S
        while not self._stop.is_set():
            try:
                listing = api.get(path)
                for item in listing["items"]:
                    handler(api, "ADDED", item)
                if after_list is not None:
                    after_list(listing["items"])
                backoff = BACKOFF_FIRST_S
                self._watch(api, path, listing["metadata"]["resourceVersion"], handler)
            except (ApiError, requests.RequestException, ValueError, OSError) as error:
                # 410 Gone, an apiserver restart, a failed create or delete: list again, which retries.
                log.warning("lab provisioner: %s: %s; listing again in %.1f s", path, error, backoff)
            except Exception:  # a bug must not silently end provisioning for the rest of the lab
                log.exception("lab provisioner: %s failed; listing again in %.1f s", path, backoff)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _watch(self, api: Rest, path: str, version: str, handler: Handler) -> None:
        while not self._stop.is_set():
            for event in api.watch(path, version, WATCH_WINDOW_S):
                obj = event["object"]
                if event["type"] == "ERROR":
                    raise ApiError(int(obj.get("code", 500)), str(obj.get("message")), f"watch {path}")
                version = obj["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    handler(api, event["type"], obj)

    # claims -> volumes --------------------------------------------------------------------------
    def _on_claim(self, api: Rest, event: str, claim: JSON) -> None:
        if event == "DELETED" or not self._wants_volume(claim):
            return
        storage_class_name = claim["spec"]["storageClassName"]
        try:
            sc = api.get(f"{CLASS_PATH}/{storage_class_name}")
        except ApiError as error:
            if error.status == 404:
                return
            raise
        problem = _unsupported(claim)
        if problem:
            self._report_once(api, claim, problem)
            return
        self._provision(api, claim, sc)

    @staticmethod
    def _wants_volume(claim: JSON) -> bool:
        """Unbound, alive, and handed to us by the PV controller (which first tries existing volumes)."""
        annotations = claim["metadata"].get("annotations") or {}
        return (not claim["spec"].get("volumeName")
                and claim.get("status", {}).get("phase") not in ("Bound", "Lost")
                and not claim["metadata"].get("deletionTimestamp")
                and any(annotations.get(key) == PROVISIONER for key in ANN_STORAGE_PROVISIONER))

    def _provision(self, api: Rest, claim: JSON, sc: JSON) -> None:
        meta, spec = claim["metadata"], claim["spec"]
        name = volume_name(claim)
        directory = self.root / f"{name}_{meta['namespace']}_{meta['name']}"
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(VOLUME_MODE)  # chmod, not mkdir's mode: the umask would take bits away
        volume = {
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {ANN_PROVISIONED_BY: PROVISIONER}},
            "spec": {
                "capacity": {"storage": spec["resources"]["requests"]["storage"]},
                "accessModes": spec["accessModes"],  # ReadWriteMany too: every lab node is this machine
                "persistentVolumeReclaimPolicy": sc.get("reclaimPolicy", "Delete"),
                "storageClassName": sc["metadata"]["name"],
                "volumeMode": spec.get("volumeMode", "Filesystem"),
                "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
                "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                             "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]},
            },
        }
        try:
            api.post("/api/v1/persistentvolumes", volume)
        except ApiError as error:
            if error.status == 409:
                return  # made on an earlier pass; the PV controller binds it
            raise
        log.info("lab provisioner: %s for claim %s/%s at %s", name, meta["namespace"], meta["name"], directory)
        _post_event(api, claim, "Normal", "ProvisioningSucceeded", f"Successfully provisioned volume {name}")

    def _report_once(self, api: Rest, claim: JSON, problem: str) -> None:
        uid = claim["metadata"]["uid"]
        if uid not in self._failure_reported:
            self._failure_reported.add(uid)
            _post_event(api, claim, "Warning", "ProvisioningFailed", problem)

    # volumes: reclaim ---------------------------------------------------------------------------
    def _on_volume(self, api: Rest, event: str, volume: JSON) -> None:
        meta = volume["metadata"]
        if (meta.get("annotations") or {}).get(ANN_PROVISIONED_BY) != PROVISIONER:
            return
        if event == "DELETED":
            self._remove_directory(meta["name"])  # deleted by someone else: its data goes with it
            return
        released = volume.get("status", {}).get("phase") == "Released"
        if released and volume["spec"].get("persistentVolumeReclaimPolicy") == "Delete":
            # Data first: if that fails, the PV stays Released and the next list tries again.
            self._remove_directory(meta["name"])
            if meta.get("deletionTimestamp"):
                return  # asked already; the pv-protection finalizer lets it go
            try:
                api.delete(f"/api/v1/persistentvolumes/{meta['name']}")
            except ApiError as error:
                if error.status != 404:
                    raise
            log.info("lab provisioner: deleted %s (claim gone, reclaim policy Delete)", meta["name"])

    def _remove_directory(self, volume: str) -> None:
        # Found by name under our root, never from the PV's path: a PV's spec must not steer an rmtree.
        for directory in self.root.glob(f"{volume}_*"):
            shutil.rmtree(directory)

    def _collect_orphans(self, listed: list[JSON]) -> None:
        """Remove directories whose PV is gone (deleted while we were not watching)."""
        volumes = {pv["metadata"]["name"] for pv in listed}
        for directory in self.root.iterdir():
            young = time.time() - directory.stat().st_mtime < ORPHAN_GRACE_S
            if directory.name.split("_")[0] not in volumes and not young:
                log.info("lab provisioner: removing %s (its PV is gone)", directory)
                shutil.rmtree(directory)


def _unsupported(claim: JSON) -> str:
    spec = claim["spec"]
    if spec.get("selector"):
        return "claim.spec.selector is not supported by the lab provisioner"
    if spec.get("volumeMode") == "Block":
        return "volumeMode Block is not supported by the lab provisioner (directories only)"
    if spec.get("dataSource") or spec.get("dataSourceRef"):
        return "data sources (snapshots, clones) are not supported by the lab provisioner"
    return ""


def _post_event(api: Rest, claim: JSON, kind: str, reason: str, message: str) -> None:
    """An Event on the claim (what `kubectl describe pvc` shows); losing one is not worth a retry."""
    meta = claim["metadata"]
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                           "name": meta["name"], "uid": meta["uid"]},
        "type": kind, "reason": reason, "message": message, "source": {"component": PROVISIONER},
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }
    try:
        api.post(f"/api/v1/namespaces/{meta['namespace']}/events", event)
    except (ApiError, requests.RequestException) as error:
        log.warning("lab provisioner: event %s on %s/%s not posted: %s", reason, meta["namespace"],
                    meta["name"], error)
