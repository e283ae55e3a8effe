"""ftplane's callback for PyTorch Lightning: `from ftplane.sdk.lightning import FtplaneCallback` (its implementation
is ftplane.trainer.sdk.lightning, the file trainer/sdk/lightning.py; see there)."""

from ftplane.trainer.sdk.lightning import FtplaneCallback, StepLog

__all__ = ["FtplaneCallback", "StepLog"]
