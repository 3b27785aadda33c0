"""The pure core, the ground floor: the spec and its checks, names, the pods to make, the lifecycle and
failure decisions, what the status says. No I/O and no Kubernetes client: everything above calls it."""
