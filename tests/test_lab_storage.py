"""The lab's default StorageClass: a bare claim binds to a provisioned hostPath volume, as on kind or minikube."""

from __future__ import annotations

import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests.lab.fixtures import pod_log_text
from tests.lab.images import REPO
from tests.lab.lab import Lab
from tests.lab.pods import pod_manifest, wait_pod
from tests.lab.procs import wait_for
from tests.lab.provisioner import ANN_PROVISIONED_BY, ANN_STORAGE_PROVISIONER, PROVISIONER, STORAGE_CLASS
from tests.lab.rest import JSON, ApiError

pytestmark = pytest.mark.lab

EXAMPLE_CLAIM = REPO / "examples" / "storage" / "checkpoints-pvc.yaml"
CLAIM = "digits-checkpoints"  # the name in the example
BIND_TIMEOUT_S = 15
KUBE_CONTROLLER_BACKOFF_S = 150  # a reflector's longest wait after an outage (60 s), twice, and room


def _claim(lab: Lab, namespace: str, name: str = CLAIM) -> JSON:
    return lab.api.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}")


def _apply_example_and_wait_bound(lab: Lab, namespace: str) -> tuple[JSON, JSON]:
    """The example applied unchanged; returns the bound claim and its PersistentVolume."""
    lab.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE_CLAIM))
    wait_for(lambda: _claim(lab, namespace).get("status", {}).get("phase") == "Bound", BIND_TIMEOUT_S,
             f"claim {namespace}/{CLAIM} to bind", interval=0.2)
    claim = _claim(lab, namespace)
    return claim, lab.api.get(f"/api/v1/persistentvolumes/{claim['spec']['volumeName']}")


def _handed_to_provisioner(claim: JSON) -> bool:
    annotations = claim["metadata"].get("annotations") or {}
    return any(annotations.get(key) == PROVISIONER for key in ANN_STORAGE_PROVISIONER)


def _gone(lab: Lab, path: str) -> bool:
    try:
        lab.api.get(path)
    except ApiError as error:
        if error.status == 404:
            return True
        raise
    return False


def test_default_class_binds_the_example_claim(lab: Lab, namespace: str) -> None:
    sc = lab.api.get(f"/apis/storage.k8s.io/v1/storageclasses/{STORAGE_CLASS}")
    assert sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert (sc["provisioner"], sc["reclaimPolicy"], sc["volumeBindingMode"]) == (PROVISIONER, "Delete", "Immediate")

    claim, volume = _apply_example_and_wait_bound(lab, namespace)
    assert claim["spec"]["storageClassName"] == STORAGE_CLASS, "filled in by the DefaultStorageClass admission"
    assert claim["status"]["capacity"]["storage"] == "1Gi"
    assert claim["status"]["accessModes"] == ["ReadWriteMany"]

    spec = volume["spec"]
    assert volume["metadata"]["annotations"][ANN_PROVISIONED_BY] == PROVISIONER
    assert volume["status"]["phase"] == "Bound"
    assert spec["storageClassName"] == STORAGE_CLASS and spec["persistentVolumeReclaimPolicy"] == "Delete"
    assert spec["capacity"]["storage"] == "1Gi" and spec["accessModes"] == ["ReadWriteMany"]
    assert spec["claimRef"]["uid"] == claim["metadata"]["uid"]

    directory = Path(spec["hostPath"]["path"])
    assert directory.is_dir() and directory.is_relative_to(lab.run_dir)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o777
    events = lab.api.get(f"/api/v1/namespaces/{namespace}/events",
                         fieldSelector=f"involvedObject.uid={claim['metadata']['uid']}")["items"]
    assert "ProvisioningSucceeded" in {e["reason"] for e in events}


def test_a_non_root_user_can_write_into_the_volume(lab: Lab, namespace: str) -> None:
    # Trainer pods run as uid 1000 on a real kubelet: the directory and the path to it must let them in.
    _, volume = _apply_example_and_wait_bound(lab, namespace)
    target = Path(volume["spec"]["hostPath"]["path"]) / "by-uid-1000"
    subprocess.run(["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", "touch", str(target)],
                   check=True, capture_output=True, text=True)
    assert target.stat().st_uid == 1000


def test_a_pod_writes_into_the_provisioned_directory(lab: Lab, namespace: str) -> None:
    _, volume = _apply_example_and_wait_bound(lab, namespace)
    script = "import os; open('/checkpoints/owner', 'w').write(os.environ['POD_UID']); print('wrote', flush=True)"
    manifest = pod_manifest("writer", ["python"], ["-c", script],
                            nodeSelector={"kubernetes.io/hostname": lab.node_names[0]})
    container = manifest["spec"]["containers"][0]
    container["env"] = [{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]
    container["volumeMounts"] = [{"name": "ckpt", "mountPath": "/checkpoints"}]
    manifest["spec"]["volumes"] = [{"name": "ckpt", "persistentVolumeClaim": {"claimName": CLAIM}}]
    lab.api.post(f"/api/v1/namespaces/{namespace}/pods", manifest)

    pod = wait_pod(lab.api, namespace, "writer", ("Succeeded", "Failed"))
    assert pod["status"]["phase"] == "Succeeded", pod_log_text(lab, namespace, "writer")
    assert (Path(volume["spec"]["hostPath"]["path"]) / "owner").read_text() == pod["metadata"]["uid"]


def test_deleting_the_claim_deletes_the_volume_and_its_data(lab: Lab, namespace: str) -> None:
    _, volume = _apply_example_and_wait_bound(lab, namespace)
    name, directory = volume["metadata"]["name"], Path(volume["spec"]["hostPath"]["path"])
    (directory / "checkpoint-100.pt").write_bytes(b"weights")

    lab.kubectl("delete", "-n", namespace, "-f", str(EXAMPLE_CLAIM))
    wait_for(lambda: _gone(lab, f"/api/v1/persistentvolumes/{name}"), 30, f"PV {name} to be deleted",
             interval=0.2)
    assert not directory.exists()


def test_claims_without_a_class_are_left_alone(lab: Lab, namespace: str) -> None:
    # create_volume's claims ask for storageClassName "" and a named volume: no provisioning for them.
    lab.create_volume(namespace, "static")
    claim = _claim(lab, namespace, "static")
    assert claim["spec"]["storageClassName"] == ""
    assert claim["spec"]["volumeName"] == f"lab-{namespace}-static"
    time.sleep(2)  # time enough for the provisioner's watch to have seen the claim
    assert _gone(lab, f"/api/v1/persistentvolumes/pvc-{claim['metadata']['uid']}")


def test_provisioning_resumes_after_an_apiserver_restart(lab: Lab, namespace: str) -> None:
    # The provisioner's watches break; it must list again and serve a claim made afterwards.
    lab.restart_apiserver()
    lab.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE_CLAIM))
    # The PV controller's part comes first and may be slow: after repeated restarts its informers back off
    # (client-go: 30 s cap, jitter up to twice that) before they see the claim. Ours must then be prompt.
    wait_for(lambda: _handed_to_provisioner(_claim(lab, namespace)), KUBE_CONTROLLER_BACKOFF_S,
             f"the PV controller to hand claim {namespace}/{CLAIM} to the provisioner", interval=0.5)
    uid = _claim(lab, namespace)["metadata"]["uid"]
    wait_for(lambda: not _gone(lab, f"/api/v1/persistentvolumes/pvc-{uid}"), BIND_TIMEOUT_S,
             f"the provisioner to make a volume for {namespace}/{CLAIM} after the restart", interval=0.2)
    wait_for(lambda: _claim(lab, namespace).get("status", {}).get("phase") == "Bound", KUBE_CONTROLLER_BACKOFF_S,
             f"claim {namespace}/{CLAIM} to bind after the restart", interval=0.5)
    volume = lab.api.get(f"/api/v1/persistentvolumes/{_claim(lab, namespace)['spec']['volumeName']}")
    assert volume["metadata"]["annotations"][ANN_PROVISIONED_BY] == PROVISIONER
