"""Command line of the kernel build: ``python -m lessonkit build``."""
from __future__ import annotations

import sys

from .core import native


def main(argv: list[str] | None = None) -> int:
    """``python -m lessonkit [build|simde-include|cflags]``: the kernel build, for the Makefile."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m lessonkit", description=main.__doc__)
    p.add_argument("what", choices=["build", "simde-include", "cflags"])
    p.add_argument("--debug", action="store_true", help="the -O0 -g build")
    p.add_argument("--arch-only", action="store_true",
                   help="cflags: only the flags that pick the CPU path (for the C test program)")
    args = p.parse_args(argv)
    try:
        if args.what == "simde-include":
            print(native.simde_include_dir() or "")
        elif args.what == "cflags":
            print(" ".join(native.arch_flags() if args.arch_only else native.compile_flags(args.debug)))
        else:
            path = native.library_path(args.debug)
            shown = path.relative_to(native.REPO_DIR) if path.is_relative_to(native.REPO_DIR) else path
            print(f"{shown}  backend: {native.backend(args.debug)}  (checked against the reference)")
    except native.BuildError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
