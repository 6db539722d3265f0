"""The check of a library on larger caches than its new-build check ran on (lesson 04's and 06's
edited kernels above all). ``KVCacheQ8.kernel_args`` calls ``cover`` before every kernel call into the
student's process, with the cache's shape; ``lessonkit.native`` built, checked and loaded the library.
"""
from __future__ import annotations

import os
import threading

from . import native
from .language import _

# A new build is checked on smoke.py's cases, the largest 4,100 tokens of 8 kv heads of head_dim 128 in
# blocks of 16. A call on a cache that no case covers (every size a buffer could be sized by at most a
# case's: _checked_length) first has its library checked again, in a child process, on a cache of the
# call's shape and at least its length: a buffer sized for short caches (a `float seen[8192]` in a
# student's edit, or one sized by tokens x head_dim) then fails there, never in the student's process.
# The length is rounded up to a power of two, at least twice the length covered before, so a cache
# growing token by token is checked a few times, not at every call; each shape that passed is kept in
# the library's record. A record from before shapes were kept covers nothing: its first call re-checks.
ROUND_UP_TO = 1 << 22  # above this, the check runs at the call's own length (no rounding up)
_cover_lock = threading.Lock()  # one check at a time: threads calling together wait for the first one


def _free_cover_lock_in_child() -> None:
    """A child forked while a thread of the parent was checking gets a free lock (as KVCacheQ8's)."""
    global _cover_lock
    _cover_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_free_cover_lock_in_child)


def _checked_length(record: dict, shape: tuple) -> int:
    """The longest cache of ``shape``'s kv heads, head_dim and block size that a case of ``record`` covers:
    one whose every size a buffer could be sized by (tokens, tokens x head_dim, tokens x kv heads, tokens x
    kv_dim, blocks; and per token head_dim and kv_dim) is at most that case's. 0 if none."""
    unused, nkv, hd, bs = shape
    entries = record.get("covered")
    best = 0
    for c in entries if isinstance(entries, list) else []:
        if not (isinstance(c, list) and len(c) == 4 and all(isinstance(x, int) and x > 0 for x in c)):
            continue  # a damaged entry covers nothing
        T2, nkv2, hd2, bs2 = c
        if hd <= hd2 and nkv * hd <= nkv2 * hd2:
            best = max(best, min(T2, T2 * hd2 // hd, T2 * nkv2 // nkv, T2 * nkv2 * hd2 // (nkv * hd),
                                 -(-T2 // bs2) * bs))
    return best


def cover(lib, seq_len: int, n_kv_heads: int, head_dim: int, block_size: int) -> None:
    """Make sure ``lib`` passed its check on a cache at least this large before it is called on one:
    runs the check on a cache of this shape if no case covered it (lessonkit.smoke, in a child
    process) and raises native.KernelCheckError, before the call, if the library crashes, hangs or (loaded
    with verify="results") computes wrong results there. A library load() did not open is not checked
    here (there is nothing known to check it against)."""
    entry = native._records.get(id(lib))
    if entry is None or entry[0] is not lib:
        return
    with _cover_lock:
        unused, path, record, verify = native._records[id(lib)]
        shape = (seq_len, n_kv_heads, head_dim, block_size)
        checked = _checked_length(record, shape)
        if seq_len <= checked or verify == "skip":
            return
        n = max(seq_len, 2 * checked)
        n = 1 << (n - 1).bit_length() if n <= ROUND_UP_TO else seq_len
        refused = record.get("refused", {}).get(shape[1:])  # this process saw it fail on that shape
        if refused and n >= refused[0]:
            raise native.KernelCheckError(refused[1])
        result = native._smoke(path, record["header"], verify, [n, *shape[1:]])
        if result["crash"] or (result["failures"] and verify == "results"):
            message = _refusal(result, checked, n, shape)
            record.setdefault("refused", {})[shape[1:]] = (n, message)
            raise native.KernelCheckError(message)
        if result["failures"]:
            native._warn_wrong(verify, result["failures"], _(" (on a cache of {n} tokens)").format(n=n))
        record["covered"] = [*record.get("covered", []), [n, *shape[1:]]]
        try:
            native._write_record(path, {k: v for k, v in record.items() if k != "refused"})
        except native.BuildError:
            pass  # a read-only folder (a class hub's prebuilt libraries): this process remembers it


def _refusal(result: dict, checked: int, n: int, shape: tuple) -> str:
    seq_len, nkv, hd, bs = shape
    if result["crash"]:
        what, why = result["crash"], _("A buffer sized for short caches (such as float seen[8192]), or by tokens x "
                                       "head_dim, is the usual cause: size it by seq_len, or do without it.")
    else:
        what = _("computes wrong results against the reference:\n{lines}").format(
                 lines=native._failure_lines(result["failures"]))
        why = _("A counter or a sum that overflows or loses precision on long caches is the usual cause.")
    return _("This build of the kernel passed its check on caches of up to {checked} tokens of this shape "
             "({nkv} kv heads, head_dim {hd}, blocks of {bs}); checked now on a cache of {n} tokens (in a child "
             "process, before your call on {seq_len} tokens), it {what}\nThe call was not made; your process and "
             "what it holds are safe. {why} Calls on smaller caches still run.").format(
             checked=checked, nkv=nkv, hd=hd, bs=bs, n=n, seq_len=seq_len, what=what, why=why)
