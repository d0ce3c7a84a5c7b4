"""`python -m kiln <command>`: kiln's command line. Each command lives in its own module, which
provides HELP, add_arguments(parser) and run(args) -> exit status; COMMANDS lists them."""

from __future__ import annotations

import argparse
import sys

from . import download

COMMANDS = {
    "download": download,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kiln")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.HELP, description=command.HELP)
        command.add_arguments(p)
        p.set_defaults(run=command.run)
    args = ap.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
