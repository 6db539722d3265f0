"""lessonkit: the helpers that the workbook's notebooks import.

Each helper's docstring names the lesson that introduces it. Notebooks import; they do not
redefine."""
from . import kernels, native, quant, reference
from .cache import KVCacheQ8
from .kernels import attend, attend_group, attend_split
from .language import set_language
from .native import BuildError

__all__ = ["attend", "attend_group", "attend_split", "KVCacheQ8", "BuildError", "kernels", "native", "quant",
           "reference", "set_language"]
