"""Where the tests find the repository's own files, wherever a test module sits."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
