"""Share the tiny feature-cache fixture of tests/drafters."""
from drafters.conftest import tiny_features  # noqa: F401
