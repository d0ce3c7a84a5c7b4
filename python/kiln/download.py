"""`python -m kiln download`: prefetch a release's precompiled modules for offline use.

    python -m kiln download --arch-list "8.0 9.0a"          # CUDA modules, into the download cache
    python -m kiln download --toolchain host --dest /mnt/kiln-artifacts

Downloads the manifest of <kiln version>/<arch list tag>/<python abi> from the artifact repository
(KILN_ARTIFACT_REPOSITORY or --repository), checks it against the digest this kiln release pins,
then every module it lists, verified, at most KILN_DOWNLOAD_JOBS (or -j) at a time. By default
they land in the download cache ($KILN_WORKSPACE_BASE/downloads), where kiln finds them; --dest
writes the same layout elsewhere, for a machine that sets KILN_ARTIFACT_DIR to a copy of it.
"""

from __future__ import annotations

import argparse
import sys

from kiln.runtime import env, sources
from kiln.runtime.arch import ArchError, parse_arch_list
from kiln.runtime.artifacts import ArtifactError, ReleaseId, prefetch, tag_for
from kiln.runtime.download import DownloadError
from kiln.runtime.manifest import ManifestError

HELP = "prefetch precompiled modules from the artifact repository for offline use"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch-list", help="the release's CUDA arch list, e.g. '8.0 9.0a'")
    p.add_argument("--toolchain", choices=("cuda", "host", "triton"),
                   help="cuda (default with --arch-list), host (the CPU backend) or triton (the "
                        "triton modules of that arch list)")
    p.add_argument("--repository", help="repository URL (default: KILN_ARTIFACT_REPOSITORY)")
    p.add_argument("--dest", help="write <version>/<tag>/<abi>/ below this directory instead of "
                                  "the download cache")
    p.add_argument("--python-abi", default=None,
                   help=f"the Python ABI to fetch for (default: this one, {sources.python_abi()})")
    p.add_argument("-j", "--jobs", type=int, default=0,
                   help="parallel downloads (default: KILN_DOWNLOAD_JOBS)")


def run(args: argparse.Namespace) -> int:
    try:
        toolchain = args.toolchain or ("cuda" if args.arch_list else None)
        if toolchain is None:
            raise ArtifactError("name the release: --arch-list '8.0 9.0a' for CUDA modules, or "
                                "--toolchain host for the CPU backend")
        if toolchain in ("cuda", "triton") and not args.arch_list:
            raise ArtifactError(f"--toolchain {toolchain} needs --arch-list (the release's arch list)")
        archs = parse_arch_list(args.arch_list) if toolchain in ("cuda", "triton") else ()
        rid = ReleaseId(sources.kiln_version(), tag_for(toolchain, archs),
                        args.python_abi or sources.python_abi())
        repository = args.repository or env.get("KILN_ARTIFACT_REPOSITORY")
        result = prefetch(rid, repository, args.dest, args.jobs or None)
    except (ArtifactError, DownloadError, ManifestError, ArchError, env.EnvError) as e:
        print(f"kiln download: error: {e}", file=sys.stderr)
        return 1
    print(f"{rid.path}: {result.downloaded} file(s) downloaded, {result.present} already present "
          f"({result.size / 1e6:.1f} MB of modules) in {result.directory}")
    return 0
