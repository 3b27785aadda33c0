"""kubetrain's built-in trainer; run it with ``python -m kubetrain_trainer`` or ``torchrun -m kubetrain_trainer``.

Your own script reports its progress with ``from kubetrain_trainer import report`` (see
:mod:`kubetrain_trainer.reporting`; importing it does not import torch).
"""

from .reporting import Reporter, report

__all__ = ["Reporter", "__version__", "report"]

__version__ = "0.1.0"
