"""`python -m codegen ...` from the repository root: kiln's build-graph CLI (kiln.codegen.cli).

Wherever kiln is installed (editable or from a wheel) the same CLI is `kiln-build ...` or
`python -m kiln.codegen ...`. In a checkout with no install, kiln is imported from python/.
"""

import sys
from pathlib import Path

try:
    import kiln  # noqa: F401 - only to find out whether kiln is importable
except ModuleNotFoundError as e:
    if e.name != "kiln":
        raise
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from kiln.codegen.cli import main  # noqa: E402

sys.exit(main())
