"""lessonkit: the helpers that the workbook's notebooks import.

Each helper's docstring names the lesson that introduces it. Notebooks import; they do not
redefine."""
from . import native, quant, reference
from .attention import attend
from .beyond import attend_group, attend_split
from .cache import KVCacheQ8
from .native import BuildError

__all__ = ["attend", "attend_group", "attend_split", "KVCacheQ8", "BuildError", "native", "quant", "reference"]
