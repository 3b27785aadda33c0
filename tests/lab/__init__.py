"""The lab: a real Kubernetes control plane built from Go modules, plus a process kubelet.

See docs/lab.md. Entry points: ``python -m tests.lab up|down|build``, the pytest plugin
``tests.lab.fixtures`` and :class:`tests.lab.lab.Lab`.
"""
