"""Turning a pod's spec into what a process needs: environment (downward API included) and volumes."""

from __future__ import annotations

import base64
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from tests.lab.rest import JSON, ApiError, Rest

_SUFFIXES: dict[str, Decimal | int] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class NotReadyYetError(Exception):
    """The pod cannot start yet (unbound claim, missing ConfigMap...): report it and retry."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def parse_quantity(text: str) -> Decimal:
    match = re.fullmatch(r"([0-9.eE+-]+?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|)", str(text))
    if not match:
        raise ValueError(f"bad quantity {text!r}")
    return Decimal(match.group(1)) * Decimal(_SUFFIXES[match.group(2)])


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, $$ escapes, unknown stay as written."""
    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return _VAR.sub(substitute, text)


def _field(pod: JSON, path: str) -> str:
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
    labelled = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if labelled:
        return str((meta.get(labelled.group(1)) or {}).get(labelled.group(2), ""))
    values = {
        "metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
        "metadata.labels": "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get("labels") or {}).items())),
        "metadata.annotations": "\n".join(
            f'{k}="{v}"' for k, v in sorted((meta.get("annotations") or {}).items())),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": status.get("podIP", ""),
        "status.podIPs": ",".join(p["ip"] for p in status.get("podIPs") or []),
        "status.hostIP": status.get("hostIP", ""),
        "status.hostIPs": ",".join(p["ip"] for p in status.get("hostIPs") or []),
    }
    if path not in values:
        raise NotReadyYetError("CreateContainerConfigError", f"unsupported fieldRef {path!r}")
    return str(values[path])


def _resource(container: JSON, ref: JSON, node_allocatable: JSON) -> str:
    kind, _, name = ref["resource"].partition(".")
    value = (container.get("resources", {}).get(kind) or {}).get(name)
    if value is None and kind == "limits":
        value = node_allocatable.get(name, "0")  # kubelet falls back to the node's allocatable
    divisor = parse_quantity(ref.get("divisor") or "1") or Decimal(1)  # the API defaults it to "0"
    amount = parse_quantity(value or "0") / divisor
    return str(math.ceil(amount))


class PodSpecReader:
    def __init__(self, api: Rest, pod: JSON) -> None:
        self.api = api
        self.pod = pod
        self.namespace = pod["metadata"]["namespace"]

    def _object(self, kind: str, name: str, optional: bool) -> JSON | None:
        try:
            return self.api.get(f"/api/v1/namespaces/{self.namespace}/{kind}/{name}")
        except ApiError as error:
            if error.status == 404 and optional:
                return None
            if error.status == 404:
                raise NotReadyYetError("CreateContainerConfigError",
                                       f"{kind[:-1]} {name!r} not found") from error
            raise

    def _data(self, kind: str, name: str, optional: bool) -> dict[str, str]:
        obj = self._object(kind, name, optional)
        if obj is None:
            return {}
        if kind == "secrets":
            return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        return dict(obj.get("data") or {})

    def env(self, container: JSON, base: dict[str, str], node_allocatable: JSON) -> dict[str, str]:
        env = dict(base)
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            for kind, key in (("configmaps", "configMapRef"), ("secrets", "secretRef")):
                if key in source:
                    ref = source[key]
                    for k, v in self._data(kind, ref["name"], bool(ref.get("optional"))).items():
                        env[prefix + k] = v
        for item in container.get("env") or []:
            name = item["name"]
            if "valueFrom" not in item:
                env[name] = expand(item.get("value", ""), env)
                continue
            source = item["valueFrom"]
            if "fieldRef" in source:
                env[name] = _field(self.pod, source["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in source:
                env[name] = _resource(container, source["resourceFieldRef"], node_allocatable)
            else:
                kind, key = ("configmaps", "configMapKeyRef") if "configMapKeyRef" in source \
                    else ("secrets", "secretKeyRef")
                ref = source[key]
                data = self._data(kind, ref["name"], bool(ref.get("optional")))
                if ref["key"] in data:
                    env[name] = data[ref["key"]]
                elif not ref.get("optional"):
                    raise NotReadyYetError("CreateContainerConfigError",
                                      f"couldn't find key {ref['key']} in {kind[:-1]} {ref['name']}")
        return env

    # volumes ------------------------------------------------------------------------------------
    def volume_path(self, volume: JSON, pod_dir: Path, shm_dir: Path) -> Path:
        """Materialise one volume as a host directory and return it."""
        name = str(volume["name"])
        path: Path
        if "emptyDir" in volume:
            medium = (volume["emptyDir"] or {}).get("medium")
            path = (shm_dir if medium == "Memory" else pod_dir / "volumes") / name
        elif "persistentVolumeClaim" in volume:
            return self._claim_path(volume["persistentVolumeClaim"]["claimName"])
        elif "hostPath" in volume:
            path = Path(volume["hostPath"]["path"])
        elif "configMap" in volume or "secret" in volume or "downwardAPI" in volume or "projected" in volume:
            path = pod_dir / "volumes" / name
            path.mkdir(parents=True, exist_ok=True)
            for file_name, content in self._files(volume).items():
                (path / file_name).parent.mkdir(parents=True, exist_ok=True)
                (path / file_name).write_text(content)
            return path
        else:
            raise NotReadyYetError("ContainerCreating", f"volume {name!r}: type not supported by the lab")
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _claim_path(self, claim: str) -> Path:
        pvc = self._object("persistentvolumeclaims", claim, optional=False) or {}
        volume_name = pvc.get("spec", {}).get("volumeName")
        if pvc.get("status", {}).get("phase") != "Bound" or not volume_name:
            raise NotReadyYetError("ContainerCreating", f"persistentvolumeclaim {claim!r} is not bound")
        pv = self.api.get(f"/api/v1/persistentvolumes/{volume_name}")["spec"]
        host = (pv.get("hostPath") or pv.get("local") or {}).get("path")
        if not host:
            raise NotReadyYetError("ContainerCreating",
                                   f"volume {volume_name!r} is neither hostPath nor local")
        Path(host).mkdir(parents=True, exist_ok=True)
        return Path(host)

    def _files(self, volume: JSON) -> dict[str, str]:
        sources: list[JSON]
        if "projected" in volume:
            sources = volume["projected"].get("sources") or []
        else:
            sources = [{k: v} for k, v in volume.items() if k != "name"]
        files: dict[str, str] = {}
        for source in sources:
            files.update(self._source_files(source))
        return files

    def _source_files(self, source: JSON) -> dict[str, str]:
        if "configMap" in source or "secret" in source:
            kind, ref = ("configmaps", source["configMap"]) if "configMap" in source \
                else ("secrets", source["secret"])
            name = ref.get("name") or ref.get("secretName", "")
            data = self._data(kind, name, bool(ref.get("optional")))
            items = ref.get("items")
            return {i["path"]: data[i["key"]] for i in items if i["key"] in data} if items else data
        if "downwardAPI" in source:
            return {i["path"]: _field(self.pod, i["fieldRef"]["fieldPath"])
                    for i in source["downwardAPI"].get("items") or [] if "fieldRef" in i}
        if "serviceAccountToken" in source:
            return {source["serviceAccountToken"]["path"]: self._token(source["serviceAccountToken"])}
        return {}

    def _token(self, request: JSON) -> str:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        account = spec.get("serviceAccountName", "default")
        body: dict[str, Any] = {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": request.get("expirationSeconds", 3607),
                     "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"],
                                        "uid": meta["uid"]}},
        }
        if request.get("audience"):
            body["spec"]["audiences"] = [request["audience"]]
        answer = self.api.post(f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token", body)
        return str(answer["status"]["token"])


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool


def container_mounts(container: JSON, volumes: dict[str, Path]) -> list[Mount]:
    mounts = []
    for mount in container.get("volumeMounts") or []:
        source = volumes[mount["name"]]
        if mount.get("subPath"):
            source = source / mount["subPath"]
            source.mkdir(parents=True, exist_ok=True)
        mounts.append(Mount(source, mount["mountPath"], bool(mount.get("readOnly"))))
    return mounts
