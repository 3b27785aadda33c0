"""The operator's process: its entry and settings, kopf's handlers, one record per job, its metrics and
memory. Reads through k8s, decides with core, acts through k8s."""
