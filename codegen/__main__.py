"""`python -m codegen ...` from the repository root, or `python -m kiln.codegen ...` anywhere."""

import sys
from pathlib import Path

try:
    from kiln.codegen.cli import main
except ModuleNotFoundError as e:
    if e.name not in ("kiln", "kiln.codegen"):
        raise
    # A source checkout without an install: map kiln -> python/kiln and its subpackages
    # codegen/ and runtime/ -> the repository's top-level folders, as the installed package does.
    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo / "python"))
    import kiln

    kiln.__path__.append(str(repo))
    from kiln.codegen.cli import main

sys.exit(main())
