"""The SDK a training loop imports: `from ftplane import sdk` (its implementation is ftplane.trainer.sdk,
the folder trainer/sdk; see that package for the API)."""

from ftplane.trainer.sdk import *  # noqa: F403 - the SDK's public names, listed once in its __all__
from ftplane.trainer.sdk import __all__ as __all__
