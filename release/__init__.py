"""Precompiled packages for an explicit arch list, and the artifact sets behind them.

    python -m release build --arch-list "8.0 9.0a" [--toolchain cuda|host] [//ops/...] [--out dist/]
    python -m release verify dist/<wheel or artifact directory> [--sass]
    python -m release pin dist/artifacts

Run from the repository root. The runtime side (reading manifests, finding and downloading
precompiled modules) is kiln.runtime's: this folder only builds, checks and pins. docs/release.md
describes the whole flow.
"""
