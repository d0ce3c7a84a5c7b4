"""`python -m release ...` from the repository root (with or without kiln installed)."""

import sys
from pathlib import Path

try:
    import kiln.codegen  # noqa: F401 - only to find out whether kiln is importable
except ModuleNotFoundError as e:
    if e.name not in ("kiln", "kiln.codegen"):
        raise
    # A source checkout without an install: map kiln -> python/kiln and its subpackages
    # codegen/ and runtime/ -> the repository's top-level folders, as the installed package does.
    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo / "python"))
    import kiln

    kiln.__path__.append(str(repo))

from release.cli import main  # noqa: E402

sys.exit(main())
