"""Kueue's controller manager in the lab, run as Kueue runs in a cluster (docs/lab.md, "Kueue").

Everything comes from the Go module ``sigs.k8s.io/kueue`` at the pinned version: the binary (built and
cached by tests/lab/build.py), its CRDs with the conversion webhooks its kustomization enables, its
Mutating/ValidatingWebhookConfiguration with the namespace selectors its kustomization patches in. Where the
cluster install points those at the ``kueue-webhook-service`` Service, the lab points them at the process by
``url:`` on the apiserver's own address, served with a certificate of the lab's CA (``caBundle``).
Kueue authenticates as its own ServiceAccount, with the module's RBAC. Internal certificate management and
leader election are off; metrics, health and the visibility server listen on free loopback ports; the visibility
API is served through the apiserver's aggregation layer (``_install_visibility``).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import shlex
import shutil
from pathlib import Path

import psutil
import yaml

from kubetrain.cli.ports import free_port
from tests.lab.build import ensure_binary, module_source_dir
from tests.lab.kubeconfig import write_kubeconfig
from tests.lab.pki import CertFiles, Pki
from tests.lab.procs import ManagedProcess, answers_ok, wait_for
from tests.lab.rest import JSON, ApiError, Rest
from tests.lab.versions import KUEUE_VERSION, MODULES, cache_root

KUEUE_MODULE_PATH = "sigs.k8s.io/kueue"
KUEUE_NAMESPACE = "kueue-system"
# config/default's namePrefix: the cluster install's object names.
NAME_PREFIX = "kueue-"
# Integrations (Configuration.integrations.frameworks) the lab enables; the operator's own kind will come
# in through ``external_frameworks``.
FRAMEWORKS = ("batch/job",)
# With internal cert management off, v0.17.0 reads the metrics and visibility servers' certificates from
# fixed paths (cmd/kueue/main.go, pkg/visibility/server.go); in a cluster they are mounted Secrets
# (config/default/cert_{metrics,visibility}_manager_patch.yaml). The lab binds them there for Kueue alone.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
VISIBILITY_CERT_DIR = Path("/visibility")
# Each mount target with the top directory the lab may have created for it on the host: removed (when empty)
# once no Kueue runs any more, leftovers of a crashed lab included.
MOUNT_TARGETS = {METRICS_CERT_DIR: Path("/etc/kueue"), VISIBILITY_CERT_DIR: VISIBILITY_CERT_DIR}
READY_TIMEOUT_S = 120.0
# The visibility API's Service, as installed (config/default's namePrefix); the aggregator checks that the server's
# certificate names it (<service>.<namespace>.svc), wherever the Service points.
VISIBILITY_SERVICE = "kueue-visibility-server"
VISIBILITY_SERVICE_DNS = f"{VISIBILITY_SERVICE}.{KUEUE_NAMESPACE}.svc"
# waitForPodsReady, as clusters that want a job's pods all running or none configure it: an admitted Workload whose
# PodsReady condition is not True within this evicts (short, so a test can see it happen).
PODS_READY_TIMEOUT_S = 30
# The lab's certificates live 30 days (tests/lab/pki.py); Kueue's token as long.
TOKEN_LIFETIME_S = 30 * 24 * 3600
NAMESPACED_KINDS = ("ServiceAccount", "Role", "RoleBinding")


def kueue_source() -> Path:
    """The module's source tree (CRDs, webhook manifests) in the Go module cache."""
    return module_source_dir(KUEUE_MODULE_PATH, KUEUE_VERSION, MODULES["kueue"].directory)


class Kueue:
    """Kueue's controller manager as a process of a lab; :meth:`start` installs what it needs first."""

    def __init__(self, run_dir: Path, pki: Pki, api: Rest, host: str, *,
                 frameworks: tuple[str, ...] = FRAMEWORKS, external_frameworks: tuple[str, ...] = ()) -> None:
        """``host``: the address the apiserver listens on; the webhook server listens there too."""
        self.dir = run_dir / "kueue"
        self.pki = pki
        self.api = api
        self.host = host
        self.frameworks = frameworks
        self.external_frameworks = external_frameworks
        self.webhook_port, self.metrics_port = free_port(), free_port()
        self.health_port, self.visibility_port = free_port(), free_port()
        self.log_path = run_dir / "logs" / "kueue.log"
        self.process: ManagedProcess | None = None

    @property
    def processes(self) -> dict[str, ManagedProcess]:
        return {"kueue": self.process} if self.process else {}

    def start(self) -> None:
        binary = ensure_binary("kueue")
        source = kueue_source()
        self.dir.mkdir(parents=True, exist_ok=True)
        webhook_certs = self._cert_dir("webhook", ips=(self.host,))
        mounts = {self._cert_dir("metrics", ips=("127.0.0.1",)): METRICS_CERT_DIR,
                  self._cert_dir("visibility", ips=("127.0.0.1",), names=(VISIBILITY_SERVICE_DNS,)):
                  VISIBILITY_CERT_DIR}
        config = self._write_config(webhook_certs)
        self._ensure_namespace()
        self._install_crds(source)
        kubeconfig = self._service_account_kubeconfig(source)
        for target in mounts.values():
            target.mkdir(parents=True, exist_ok=True)
        self.process = ManagedProcess("kueue", self._argv(binary, config, kubeconfig, mounts), self.log_path)
        self.process.start()
        wait_for(self._ready, READY_TIMEOUT_S, "kueue /readyz (its webhook server listening)", interval=0.25)
        self._install_webhooks(source)
        self._install_visibility(source)

    def stop(self) -> None:
        """Stop the process, then remove the empty mount targets unless another lab's Kueue still runs (an
        rmdir here would detach its mounts)."""
        if self.process is not None:
            self.process.stop(grace=10)
        if _kueue_running():
            return
        for target, top in MOUNT_TARGETS.items():
            for path in [target, *target.parents]:
                with contextlib.suppress(OSError):  # missing or not empty: leave it
                    path.rmdir()
                if path == top:
                    break

    # files ----------------------------------------------------------------------------------------
    def _cert_dir(self, purpose: str, ips: tuple[str, ...], names: tuple[str, ...] = ()) -> Path:
        """A serving certificate of the lab's CA, laid out as a kubernetes.io/tls Secret is mounted."""
        files: CertFiles = self.pki.issue(f"kueue-{purpose}", f"kueue-{purpose}", server=True,
                                          dns_names=("localhost", *names), ips=ips)
        directory = self.dir / f"{purpose}-certs"
        directory.mkdir(exist_ok=True)
        shutil.copyfile(files.cert, directory / "tls.crt")
        shutil.copyfile(files.key, directory / "tls.key")
        shutil.copyfile(self.pki.ca.cert, directory / "ca.crt")
        (directory / "tls.key").chmod(0o600)
        return directory

    def configuration(self, webhook_cert_dir: Path) -> JSON:
        """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2), as config/components/manager has it but
        with the lab's ports, no leader election and no internal cert management."""
        return {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
            "namespace": KUEUE_NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.metrics_port}"},
            "webhook": {"host": self.host, "port": self.webhook_port, "certDir": str(webhook_cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "visibilityServer": {"bindAddress": "127.0.0.1", "bindPort": self.visibility_port},
            "clientConnection": {"qps": 50, "burst": 100},
            "waitForPodsReady": {"timeout": f"{PODS_READY_TIMEOUT_S}s"},
            "integrations": {"frameworks": list(self.frameworks),
                             **({"externalFrameworks": list(self.external_frameworks)}
                                if self.external_frameworks else {})},
        }

    def _write_config(self, webhook_cert_dir: Path) -> Path:
        path = self.dir / "controller_manager_config.yaml"
        path.write_text(yaml.safe_dump(self.configuration(webhook_cert_dir), sort_keys=False))
        return path

    def _service_account_kubeconfig(self, source: Path) -> Path:
        """Kueue's own identity: its ServiceAccount with the module's RBAC, a TokenRequest token (as long as
        the lab's certificates live; a pod's projected token would be rotated)."""
        account = self._install_rbac(source)
        answer = self.api.post(
            f"/api/v1/namespaces/{KUEUE_NAMESPACE}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": TOKEN_LIFETIME_S}})
        return write_kubeconfig(self.dir / "kueue.kubeconfig", self.api.server, self.pki.ca.cert,
                                user=f"{KUEUE_NAMESPACE}-{account}", token=answer["status"]["token"])

    def _install_rbac(self, source: Path) -> str:
        """config/components/rbac and the visibility server's auth-reader binding, named and namespaced as
        config/default installs them; returns the ServiceAccount's name."""
        components = source / "config" / "components"
        rbac = yaml.safe_load((components / "rbac" / "kustomization.yaml").read_text())["resources"]
        files = [components / "rbac" / name for name in rbac] + [components / "visibility" / "role_binding.yaml"]
        objects = [o for f in files for o in yaml.safe_load_all(f.read_text()) if o]
        managed = {(o["kind"], o["metadata"]["name"]) for o in objects}
        for obj in objects:
            _as_installed(obj, managed)
            _create(self.api, _collection_path(obj), obj)
        return str(next(o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"))

    def _argv(self, binary: Path, config: Path, kubeconfig: Path, mounts: dict[Path, Path]) -> list[str]:
        """Certificates go where v0.17.0 looks for them (``mounts``: source -> target), in a mount namespace
        of Kueue's own."""
        kueue = [str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}",
                 f"--visibility-server-port={self.visibility_port}", "--zap-log-level=2"]
        binds = [f"mount --bind -o ro {shlex.quote(str(s))} {shlex.quote(str(t))}" for s, t in mounts.items()]
        # unshare and sh exec in turn: the pid stays Kueue's, and the mounts go with its namespace.
        script = " && ".join([*binds, 'exec "$@"'])
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "kueue", *kueue]

    # objects in the apiserver ---------------------------------------------------------------------
    def _ensure_namespace(self) -> None:
        _create(self.api, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": KUEUE_NAMESPACE}})

    def _install_crds(self, source: Path) -> None:
        """The CRDs config/components/crd lists, with the conversion webhooks its patches enable."""
        crd_dir = source / "config" / "components" / "crd"
        kustomization = yaml.safe_load((crd_dir / "kustomization.yaml").read_text())
        conversions = {}
        for patch in kustomization.get("patches") or []:
            patched = yaml.safe_load((crd_dir / patch["path"]).read_text())
            conversions[patched["metadata"]["name"]] = patched["spec"]["conversion"]
        names = []
        for resource in kustomization["resources"]:
            crd = yaml.safe_load((crd_dir / resource).read_text())
            conversion = conversions.get(crd["metadata"]["name"])
            if conversion:
                crd["spec"]["conversion"] = self._pointed_at_process(copy.deepcopy(conversion))
            _create(self.api, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            names.append(crd["metadata"]["name"])
        wait_for(lambda: all(_established(self.api, name) for name in names), 60, "Kueue's CRDs established",
                 interval=0.2)

    def _install_webhooks(self, source: Path) -> None:
        """config/components/webhook's configurations, with its kustomization's patches, named as installed."""
        webhook_dir = source / "config" / "components" / "webhook"
        patches = yaml.safe_load((webhook_dir / "kustomization.yaml").read_text()).get("patches") or []
        for configuration in yaml.safe_load_all((webhook_dir / "manifests.yaml").read_text()):
            if not configuration:
                continue
            for patch in patches:
                _merge_webhook_patch(configuration, yaml.safe_load(patch["patch"]))
            configuration["metadata"]["name"] = NAME_PREFIX + configuration["metadata"]["name"]
            for webhook in configuration["webhooks"]:
                self._pointed_at_process(webhook)
            plural = configuration["kind"].lower() + "s"
            _create(self.api, f"/apis/admissionregistration.k8s.io/v1/{plural}", configuration)

    def _install_visibility(self, source: Path) -> None:
        """config/components/visibility's APIServices, served through the apiserver's aggregation layer. The
        cluster install's Service selects Kueue's pod; the lab's is an ExternalName Service naming the host
        (``localhost``), which the aggregator dials at the APIService's port, and the APIService trusts the lab's
        CA instead of skipping TLS verification."""
        visibility = source / "config" / "components" / "visibility"
        service = yaml.safe_load((visibility / "service.yaml").read_text())
        name = NAME_PREFIX + service["metadata"]["name"]
        assert name == VISIBILITY_SERVICE, f"{name}: the module renamed the Service its certificate must name"
        _create(self.api, f"/api/v1/namespaces/{KUEUE_NAMESPACE}/services", {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": KUEUE_NAMESPACE},
            "spec": {"type": "ExternalName", "externalName": "localhost"}})
        ca_bundle = base64.b64encode(self.pki.ca.cert.read_bytes()).decode()
        names = []
        for resource in yaml.safe_load((visibility / "kustomization.yaml").read_text())["resources"]:
            api_service = yaml.safe_load((visibility / resource).read_text())
            if api_service.get("kind") != "APIService":
                continue
            spec = api_service["spec"]
            spec.pop("insecureSkipTLSVerify", None)
            spec.update(caBundle=ca_bundle, service={"namespace": KUEUE_NAMESPACE, "name": name,
                                                     "port": self.visibility_port})
            _create(self.api, "/apis/apiregistration.k8s.io/v1/apiservices", api_service)
            names.append(api_service["metadata"]["name"])
        try:
            wait_for(lambda: all(_available(self.api, n) for n in names), 60,
                     "Kueue's visibility APIServices Available", interval=0.25)
        except TimeoutError as error:
            said = [c for n in names for c in self.api.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{n}")
                    .get("status", {}).get("conditions") or []]
            raise TimeoutError(f"{error}: {said}") from error

    def _pointed_at_process(self, holder: JSON) -> JSON:
        """Replace a ``clientConfig.service`` (in ``holder`` or its ``webhook``) by the process's URL."""
        target = holder.get("webhook", holder)
        path = target["clientConfig"]["service"].get("path", "/")
        ca_bundle = base64.b64encode(self.pki.ca.cert.read_bytes()).decode()
        target["clientConfig"] = {"url": f"https://{self.host}:{self.webhook_port}{path}", "caBundle": ca_bundle}
        return holder

    def _ready(self) -> bool:
        assert self.process is not None
        self.process.check_alive()
        return answers_ok(f"http://127.0.0.1:{self.health_port}/readyz")


def _merge_webhook_patch(configuration: JSON, patch: JSON) -> None:
    """A strategic-merge patch of a webhook configuration: webhooks matched by name, fields replaced."""
    if (patch.get("kind"), patch["metadata"]["name"]) != (configuration["kind"], configuration["metadata"]["name"]):
        return
    by_name = {webhook["name"]: webhook for webhook in configuration["webhooks"]}
    for webhook_patch in patch.get("webhooks") or []:
        target = by_name.get(webhook_patch["name"])
        if target is not None:
            target.update({k: v for k, v in webhook_patch.items() if k != "name"})


def _as_installed(obj: JSON, managed: set[tuple[str, str]]) -> None:
    """What config/default's namespace, namePrefix and visibility transformers make of an RBAC object: names
    prefixed (and references to the module's own objects), namespaced objects in kueue-system, except the
    auth-reader binding, which lives in kube-system."""
    meta = obj["metadata"]
    if obj["kind"] in NAMESPACED_KINDS:
        meta["namespace"] = "kube-system" if meta.get("namespace") == "kube-system" else KUEUE_NAMESPACE
    meta["name"] = NAME_PREFIX + meta["name"]
    role = obj.get("roleRef")
    if role and (role["kind"], role["name"]) in managed:
        role["name"] = NAME_PREFIX + role["name"]
    for subject in obj.get("subjects") or []:
        if subject["kind"] == "ServiceAccount":
            subject["name"] = NAME_PREFIX + subject["name"]
            subject["namespace"] = KUEUE_NAMESPACE


def _collection_path(obj: JSON) -> str:
    kind, namespace = obj["kind"], obj["metadata"].get("namespace")
    if kind == "ServiceAccount":
        return f"/api/v1/namespaces/{namespace}/serviceaccounts"
    plural = kind.lower() + "s"
    scope = f"namespaces/{namespace}/" if kind in NAMESPACED_KINDS else ""
    return f"/apis/rbac.authorization.k8s.io/v1/{scope}{plural}"


def _kueue_running() -> bool:
    """Whether a Kueue of the lab's (any lab's) runs on this machine."""
    for proc in psutil.process_iter():
        try:
            exe = Path(proc.exe())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if exe.name == "kueue" and exe.is_relative_to(cache_root()):
            return True
    return False


def _create(api: Rest, path: str, body: JSON) -> None:
    try:
        api.post(path, body)
    except ApiError as error:
        if error.status != 409:
            raise


def _available(api: Rest, name: str) -> bool:
    service = api.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{name}")
    return any(c["type"] == "Available" and c["status"] == "True"
               for c in service.get("status", {}).get("conditions") or [])


def _established(api: Rest, name: str) -> bool:
    crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    return any(c["type"] == "Established" and c["status"] == "True"
               for c in crd.get("status", {}).get("conditions") or [])

