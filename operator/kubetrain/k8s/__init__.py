"""Talking to the cluster: the HTTP transport, the operator's API calls (whose names define its RBAC), the pod
watch, the trainer scrape, and the work queue that paces them. Imports only the core."""
