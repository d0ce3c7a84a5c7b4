"""python -m benchmarks ... (see benchmarks/__init__.py)."""

from benchmarks.cli import main

raise SystemExit(main())
