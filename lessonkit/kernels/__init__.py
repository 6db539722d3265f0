"""The compiled attention kernels, called from Python: each cffi call written once.

``attention``: ``attend`` (one query head; lesson 00), ``attend_group`` and ``time_group`` (GQA in
one scan; lesson 08), and ``kernel_inputs``, the one helper that turns (q, cache, kv_head) into the
kernel's arguments. ``split``: split-KV over threads (``attend_split``, ``attend_chunks``,
``partial``, the thread pool; lesson 08)."""
from .attention import attend, attend_group, time_group
from .split import attend_chunks, attend_split, partial, shutdown_pool

__all__ = ["attend", "attend_group", "time_group", "attend_chunks", "attend_split", "partial", "shutdown_pool"]
