"""Pinned versions of the lab's components and where their binaries are cached."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

GO_DIR = Path(__file__).resolve().parent / "go"
KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.6.16"
HELM_VERSION = "v3.22.0"
CONTAINERD_VERSION = "v2.4.2"
KUEUE_VERSION = "v0.17.0"
COREDNS_VERSION = "v1.15.0"
KWOK_VERSION = "v0.8.0"


@dataclass(frozen=True)
class GoModule:
    """One Go module of the lab's and the binaries built from its tool packages."""

    directory: Path
    version: str
    # binary name -> Go package path
    packages: dict[str, str]
    # -X flags that stamp the version into the binaries
    version_vars: tuple[str, ...] = ()
    # containerd needs cgo (seccomp, overlay snapshotter); the build tags drop storage drivers we never use
    cgo: bool = False
    tags: tuple[str, ...] = ()


def _k8s_version_vars() -> tuple[str, ...]:
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"{pkg}.gitVersion={KUBERNETES_VERSION}",
            f"{pkg}.gitMajor={major}",
            f"{pkg}.gitMinor={minor}",
            f"{pkg}.gitTreeState=clean",
            f"{pkg}.buildDate=2026-01-01T00:00:00Z",
        ]
    return tuple(flags)


MODULES: dict[str, GoModule] = {
    "k8s": GoModule(
        directory=GO_DIR / "k8s",
        version=KUBERNETES_VERSION,
        packages={
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
            # the real node (docs/lab.md, "The real node")
            "kubelet": "k8s.io/kubernetes/cmd/kubelet",
            "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
        },
        version_vars=_k8s_version_vars(),
    ),
    "etcd": GoModule(
        directory=GO_DIR / "etcd",
        version=ETCD_VERSION,
        packages={"etcd": "go.etcd.io/etcd/server/v3"},
    ),
    "helm": GoModule(
        directory=GO_DIR / "helm",
        version=HELM_VERSION,
        packages={"helm": "helm.sh/helm/v3/cmd/helm"},
        version_vars=(f"helm.sh/helm/v3/internal/version.version={HELM_VERSION}",),
    ),
    "containerd": GoModule(
        directory=GO_DIR / "containerd",
        version=CONTAINERD_VERSION,
        packages={
            "containerd": "github.com/containerd/containerd/v2/cmd/containerd",
            "containerd-shim-runc-v2": "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
            "ctr": "github.com/containerd/containerd/v2/cmd/ctr",
        },
        version_vars=(f"github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION}",),
        cgo=True,
        tags=("no_btrfs", "no_devmapper", "no_zfs"),
    ),
    # Kueue's controller manager (Lab(kueue=True), tests/lab/kueue.py); its CRDs come from the same module.
    "kueue": GoModule(
        directory=GO_DIR / "kueue",
        version=KUEUE_VERSION,
        packages={"kueue": "sigs.k8s.io/kueue/cmd/kueue"},
        version_vars=(f"sigs.k8s.io/kueue/pkg/version.GitVersion={KUEUE_VERSION}",),
    ),
    # The cluster DNS (tests/lab/dns.py): CoreDNS with every plugin of its plugin.cfg, kubernetes included.
    "coredns": GoModule(
        directory=GO_DIR / "coredns",
        version=COREDNS_VERSION,
        packages={"coredns": "github.com/coredns/coredns"},
    ),
    # Simulated nodes (tests/lab/kwok.py): kwok's controller plays Nodes and their pods with no processes.
    "kwok": GoModule(
        directory=GO_DIR / "kwok",
        version=KWOK_VERSION,
        packages={"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
        version_vars=(f"sigs.k8s.io/kwok/pkg/consts.Version={KWOK_VERSION}",),
    ),
}

BINARIES = tuple(name for module in MODULES.values() for name in module.packages)


def cache_root() -> Path:
    """Binaries live outside the repository, keyed by version; KUBETRAIN_LAB_CACHE overrides."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kubetrain-lab"
    return Path(os.environ.get("KUBETRAIN_LAB_CACHE", default))


def module_of(binary: str) -> tuple[str, GoModule]:
    for key, module in MODULES.items():
        if binary in module.packages:
            return key, module
    raise KeyError(f"unknown lab binary {binary!r}; known: {', '.join(BINARIES)}")


def module_binary_path(key: str, module: GoModule, binary: str) -> Path:
    """Where a binary of a Go module is cached, keyed by the module's name and version."""
    return cache_root() / f"{key}-{module.version}" / binary


def binary_path(binary: str) -> Path:
    key, module = module_of(binary)
    return module_binary_path(key, module, binary)
