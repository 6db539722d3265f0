"""lessonkit: the helpers that the workbook's notebooks import.

It is built in layers; each imports only the layers above it in this list, never one below:

    core/       build, check, load and call the kernel; the q8 cache, the trace, the numpy references,
                timing, the workbook's files, the language switch
    display/    what every lesson shows with: tables, the plot style, the kernel's source with its line
                numbers, check cells
    lessons/    each lesson's own helpers, a module per topic (its docstring names the lesson)
    exercises/  the auto-checked exercises, a module per lesson

The tools that only authors, teachers and the Makefile run (the kernel build's command line, the edition
builder, the benchmark's command line and report, llama.cpp's harness, the A76 estimates, lesson 09's saved
figures, the lesson copies) are the package ``workbench`` beside this one, which lessonkit never imports.

The lessons and their text use short names: ``lk.attend``, ``lk.native``, ``from lessonkit import bench,
roofline``, ``from lessonkit.table import Table``, ``lessonkit.quant.quantize_q``. Each short module name is an
alias of the module in its layer (``lessonkit.table`` is ``lessonkit.display.table``, the same module object),
made on first use by the import system below; ``lessonkit.kernels`` gathers the kernel calls of
``core.attention`` and ``lessons.split``. So ``import lessonkit`` itself loads only the language switch (the
standard library), and a fresh kernel needs no extra import before ``lk.workspace.student_native()``."""
import importlib as _importlib
import importlib.abc as _abc
import importlib.util as _util
import sys as _sys
import types as _types

from .core.language import set_language

# every module of each layer, by the short name the lessons use
_LAYERS = {
    "core": ("attention cache check compare env files header language native objects processes quant reference smoke timing "
             "toolchain trace validate variants"),
    "display": "checks plotstyle punctuation source table",
    "lessons": ("bench by_hand comparisons dataflow debug debugger kernel_copy layout lowp_error precision rescales rounding "
                "roofline setup softmax split streaming synthetic toy traffic workspace"),
}
#: short name -> the module's full name in its layer
ALIASES = {f"{__name__}.{name}": f"{__name__}.{layer}.{name}" for layer, names in _LAYERS.items()
           for name in names.split()}
_KERNELS = f"{__name__}.kernels"
ALIASES.update({f"{_KERNELS}.attention": f"{__name__}.core.attention", f"{_KERNELS}.split": f"{__name__}.lessons.split"})
# the names lk.<name> gives besides modules, and the module that holds each
_NAMES = {"attend": "core.attention", "attend_group": "core.attention", "attend_split": "lessons.split",
          "KVCacheQ8": "core.cache", "BuildError": "core.toolchain"}
# lessonkit.kernels: the kernel calls, whichever layer holds them
_KERNEL_NAMES = {**{n: "core.attention" for n in ("attend", "attend_group", "time_group", "call_kernel")},
                 **{n: "lessons.split" for n in ("Partial", "attend_chunks", "attend_split", "finish", "merge",
                                                  "merge_all", "partial", "shutdown_pool")},
                 "attention": "core", "split": "lessons"}

__all__ = ["attend", "attend_group", "attend_split", "KVCacheQ8", "BuildError", "kernels", "native", "quant",
           "reference", "set_language"]


def _kernels_module() -> _types.ModuleType:
    """``lessonkit.kernels``: ``attend``, ``attend_group``, ``time_group`` (core.attention) and the split-KV
    calls (lessons.split), each imported on first use; ``lessonkit.kernels.attention`` and ``.split`` too."""
    module = _types.ModuleType(_KERNELS, _kernels_module.__doc__)
    module.__path__ = []  # a package, so that lessonkit.kernels.split can be imported through it

    def attr(name):
        if name not in _KERNEL_NAMES:
            raise AttributeError(f"module {_KERNELS!r} has no attribute {name!r}")
        where = _importlib.import_module(f"{__name__}.{_KERNEL_NAMES[name]}")
        value = getattr(where, name)
        setattr(module, name, value)
        return value
    module.__getattr__ = attr
    module.__dir__ = lambda: sorted(_KERNEL_NAMES)
    module.__all__ = sorted(n for n in _KERNEL_NAMES if n not in ("attention", "split"))
    return module


class _Aliases(_abc.MetaPathFinder, _abc.Loader):
    """Imports a short name (``lessonkit.table``) as the module of its layer, the same object, so that
    ``from lessonkit.table import Table``, ``import lessonkit.table`` and ``lk.table`` all work and a patch
    of one is a patch of the other."""

    def __init__(self):
        self._specs = {}

    def find_spec(self, name, path=None, target=None):
        if name in ALIASES or name == _KERNELS:
            return _util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        if spec.name == _KERNELS:
            return _kernels_module()
        module = _importlib.import_module(ALIASES[spec.name])
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        # the import system has just set the module's __spec__ to the alias's: give it its own back
        own = self._specs.pop(module.__spec__.name, None)
        if own is not None:
            module.__spec__ = own


if not any(isinstance(f, _Aliases) for f in _sys.meta_path):  # once, even if this package is reloaded
    _sys.meta_path.append(_Aliases())


def __getattr__(name: str):
    # called only for a name the package does not have yet: a short module name or an object of _NAMES
    if name in _NAMES:
        value = getattr(_importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    elif f"{__name__}.{name}" in ALIASES or f"{__name__}.{name}" == _KERNELS:
        value = _importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once: the next lookup finds it
    return value


def __dir__():
    return sorted({*globals(), *_NAMES, "kernels", *(a.rsplit(".", 1)[1] for a in ALIASES if a.count(".") == 1)})


from .display import punctuation as _punctuation  # noqa: E402 - registers itself on the language switch

_punctuation.follow_language()
