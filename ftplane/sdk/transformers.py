"""ftplane's callback for the Hugging Face Trainer: `from ftplane.sdk.transformers import FtplaneCallback` (its
implementation is ftplane.trainer.sdk.transformers, the file trainer/sdk/transformers.py; see there)."""

from ftplane.trainer.sdk.transformers import FtplaneCallback

__all__ = ["FtplaneCallback"]
