"""``python -m workbench TOOL [ARGS]``: the tools that authors, teachers and the Makefile run.

Each entry of TOOLS is a module of this package with a ``main(argv) -> int``; a new tool adds one
line here and its module."""
from __future__ import annotations

import importlib
import sys

# tool name -> (module of this package, what it does: one line of --help)
TOOLS: dict[str, tuple[str, str]] = {
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
