"""The compiled attention kernels, called from Python: each cffi call written once.

``attention``: ``attend`` (one query head; lesson 00), ``attend_group`` and ``time_group`` (GQA in
one scan; lesson 08), and ``kernel_inputs``, the one helper that turns (q, cache, kv_head) into the
kernel's arguments. ``split``: the split-KV state and its merge, and split-KV over threads
(``attend_split``, ``attend_chunks``, ``partial``; lesson 08)."""
from .attention import attend, attend_group, time_group
from .split import Partial, attend_chunks, attend_split, finish, merge, merge_all, partial, shutdown_pool

__all__ = ["attend", "attend_group", "time_group", "Partial", "attend_chunks", "attend_split", "finish", "merge",
           "merge_all", "partial", "shutdown_pool"]
