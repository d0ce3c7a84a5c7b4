"""kiln's JIT runtime: compile specs, workspaces, arch context, cache keys and metadata, locks,
compile, load, in-process cache, the precompiled lookup and verified artifact downloads. Imports
only the standard library and ninja. Importing this package does nothing beyond
definitions.
"""
