"""lessonkit: the helpers that the workbook's notebooks import.

Each helper's docstring names the lesson that introduces it. Notebooks import; they do not
redefine.

Every submodule is reachable as an attribute, as the lessons' text writes it: ``lk.workspace``,
``lk.table``, ``lk.variants`` ... are imported on first use (PEP 562's module ``__getattr__``), so
``import lessonkit`` stays as fast as its eager imports below, and a fresh kernel needs no extra
``import lessonkit.workspace`` before ``lk.workspace.student_native()``."""
import importlib as _importlib
import pkgutil as _pkgutil

from . import kernels, native, quant, reference
from .cache import KVCacheQ8
from .kernels import attend, attend_group, attend_split
from .language import set_language
from .native import BuildError

__all__ = ["attend", "attend_group", "attend_split", "KVCacheQ8", "BuildError", "kernels", "native", "quant",
           "reference", "set_language"]

_submodules: frozenset = frozenset()


def _submodule_names() -> frozenset:
    """The package's submodules (one listing of its folder, the first time it is asked)."""
    global _submodules
    if not _submodules:
        _submodules = frozenset(m.name for m in _pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    return _submodules


def __getattr__(name: str):
    # called only for a name the module does not have yet: import the submodule of that name, once
    if name.startswith("_") or name not in _submodule_names():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _importlib.import_module(f".{name}", __name__)
    globals()[name] = module   # once: the import binds it too, unless it was imported before without it
    return module


def __dir__():
    return sorted({*globals(), *_submodule_names()})


from . import punctuation as _punctuation  # noqa: E402 - after set_language: it registers on the language switch

_punctuation.follow_language()
