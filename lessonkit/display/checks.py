"""A lesson's check cell: many named checks, one line of output ("7 checks passed"), the details only
of those that failed (introduced in lesson 03; every lesson's check cell uses it)."""
from __future__ import annotations

from ..core.language import _


class Checks:
    """Named checks of one lesson cell: ``add(name, ok, detail)``, then ``str()`` is one line,
    "7 checks passed", or the failed checks with their details (the lesson cell prints it)."""

    def __init__(self):
        self.results: list[tuple[str, bool, str]] = []

    def add(self, name: str, ok, detail: str = "") -> None:
        self.results.append((name, bool(ok), detail))

    def expect(self, ok, what: str) -> None:
        """``add`` with the condition first: ``what`` says what went wrong if ``ok`` is false."""
        self.add(what, ok)

    @property
    def failed(self) -> list[tuple[str, bool, str]]:
        return [r for r in self.results if not r[1]]

    def __bool__(self) -> bool:
        return not self.failed

    def __str__(self) -> str:
        n = len(self.results)
        if not self.failed:
            return _("{n} checks passed").format(n=n)
        lines = [_("{failed} of {n} checks FAILED:").format(failed=len(self.failed), n=n)]
        lines += [f"  {name}: {detail}" for name, unused, detail in self.failed]
        return "\n".join(lines)

    __repr__ = __str__
