"""kiln's build graph: BUILD loading, labels, dispatch expansion, rendering into the generated
workspace, and the CLI (`kiln-build`, `python -m kiln.codegen`). Installed as `kiln.codegen`.
Importing this package does nothing beyond definitions.
"""
