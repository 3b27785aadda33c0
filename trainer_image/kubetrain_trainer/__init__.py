"""kubetrain's built-in trainer; run it with ``python -m kubetrain_trainer`` or ``torchrun -m kubetrain_trainer``."""

__version__ = "0.1.0"
