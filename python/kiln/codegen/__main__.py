"""`python -m kiln.codegen ...`: the build-graph CLI wherever kiln is installed (also `kiln-build`)."""

import sys

from .cli import main

sys.exit(main())
