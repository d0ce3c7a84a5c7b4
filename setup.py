"""Packaging glue that pyproject.toml cannot express: a wheel carries kiln's read-only kernel
sources (WORKSPACE.py, version.txt, ops/, bindings/) and the release's pinned manifest digests
(release/pins.json) as kiln/_src. An editable install does not: there kiln.runtime finds them in
the source tree itself."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SOURCES = ("WORKSPACE.py", "version.txt", "ops", "bindings", "release/pins.json")


class BuildPyWithKernelSources(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "kiln" / "_src"
        if dest.exists():
            shutil.rmtree(dest)
        for name in SOURCES:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)


setup(cmdclass={"build_py": BuildPyWithKernelSources})
