"""``python -m workbench TOOL [ARGS]``: the tools that authors, teachers and the Makefile run.

Each entry of TOOLS is a module of this package with a ``main(argv) -> int``; a new tool adds one
line here and its module."""
from __future__ import annotations

import importlib
import sys

# tool name -> (module of this package, what it does: one line of --help)
TOOLS: dict[str, tuple[str, str]] = {
    "workspace": ("workspace", "the student's copies in my-work/: copies, update, reset LESSON, reset-native (make lab, "
                               "make update, make reset)"),
    "edition": ("edition", "the Chinese edition of the lessons: check, skeleton NN, build NN [--execute]"),
    "bench": ("bench", "the benchmark: ns per token, GB/s and the target ratios (make bench)"),
    "a76": ("a76", "llvm-mca ESTIMATES of cycles per token on the RK3588's cores (make bench-a76)"),
    "figures": ("figures", "measure lesson 09's saved figures again (make figures)"),
    "site": ("site", "the lessons as two static websites, English and Chinese, into _site/ (make site)"),
    "handouts": ("handouts", "one A4 PDF per lesson and edition, printed from the site (make handouts)"),
    "grade": ("grade", "grade the students' notebooks with otter-grader: grades.csv and a feedback page each"),
}


def usage() -> str:
    width = max((len(name) for name in TOOLS), default=0)
    lines = [f"  {name:<{width}}  {what}" for name, (unused, what) in TOOLS.items()]
    return "\n".join(["usage: python -m workbench TOOL [ARGS]   (python -m workbench TOOL --help: that tool's help)",
                      "", "tools:", *lines])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in TOOLS:
        print(f"no tool {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f".{TOOLS[name][0]}", __package__)
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
