"""`python -m release ...` from the repository root (with or without kiln installed)."""

import sys
from pathlib import Path

try:
    import kiln  # noqa: F401 - only to find out whether kiln is importable
except ModuleNotFoundError as e:
    if e.name != "kiln":
        raise
    # A checkout with no install: the kiln package is python/kiln, as a wheel installs it.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from release.cli import main  # noqa: E402

sys.exit(main())
