"""kiln's build graph: BUILD loading, labels, dispatch expansion, rendering into the generated
workspace, and the `python -m codegen` CLI. Installed as `kiln.codegen`. Importing this package
does nothing beyond definitions.
"""
