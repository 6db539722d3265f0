"""Streaming the single pass, and lesson 05's saved cache simulations (``simulations``; introduced in lesson 05).

**Partial states** (``partial_state``, ``attend_in_chunks``): the compiled kernel returns only ``out``, but its
traced build records M, S and the accumulator after every token, so a cache of one chunk gives that chunk's state;
the states merge as ``lessonkit.kernels.split.merge`` (re-exported here) does.

**The streaming experiment** (``run_stream``, lesson 05b): when the KV arrives chunk by chunk, the latency after the
last chunk differs between the single pass and its two-pass variants only by the attention work left to do."""
from __future__ import annotations

import errno
import gc
import json
import os
import platform
import queue
import tempfile
import threading
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from ..core import native
from . import traffic
from ..core import validate as check
from ..core.cache import KVCacheQ8, kv_cache
from ..core.files import write_atomic
from ..core.attention import KERNELS, call_kernel, kernel_inputs, out_buffer
from .setup import first_line
from .split import Partial, chunk_bounds, empty, finish, merge, merge_all  # noqa: F401 (lesson 05's names)
from .synthetic import cache_of  # lessons 05b and 08 call it streaming.cache_of
from ..core.language import _
from ..core.trace import run_traced

MAX_STREAM_CHUNKS = 4096    # chunks of one streaming run
MAX_INTERVAL_S = 1.0        # the producer's pause between two chunks
MAX_STREAM_S = 120.0        # n_chunks x interval_s: one run's planned duration
STALL_S = 10.0              # how long past interval_s the consumer waits for a chunk before giving up
MAX_SIMULATIONS = 64        # valgrind runs of one simulations() call
MAX_SIMULATED_TOKENS = 1 << 20
# "streaming" and "*_streamed" fold each chunk in as it arrives (ChunkedAttention); the others wait for the last
MODES = ("streaming", "two_pass_scores_streamed", "two_pass_recompute_streamed", "neon", "two_pass_scores",
         "two_pass_recompute")
PASSES = ("single", "two_pass_scores", "two_pass_recompute")
_PASSES_OF = dict(zip(MODES, PASSES))  # the first three modes' passes
FAIR_MODES = MODES  # the counted model and the timed run name the same modes
SAVE_ENV = "LESSONKIT_SAVE_RESULTS"


def partial_state(q: np.ndarray, cache: KVCacheQ8, kv_head: int = 0, scale: float | None = None) -> Partial:
    """The state (M, S, acc) of all tokens of ``cache``, read from the compiled kernel's trace after its last token."""
    trace = run_traced(np.empty(kv_cache(cache).head_dim, np.float32), q, cache, kv_head, scale,
                       fields=("M", "S", "vkq"))
    return Partial(float(trace.M[-1]), float(trace.S[-1]), trace.vkq[-1].astype(np.float64), trace.seq_len)


def attend_in_chunks(q: np.ndarray, K: np.ndarray, V: np.ndarray, bounds, block_size: int = 64,
                     scale: float | None = None) -> tuple[np.ndarray, list[Partial]]:
    """(output float32, the chunks' states): K, V ``[n, head_dim]`` split before each index in ``bounds``, each
    chunk's state from the traced kernel on a cache of that chunk alone, merged in order."""
    cuts = chunk_bounds(bounds, check.float32_array("K", K, (None, None)).shape[0])
    parts = [partial_state(q, cache_of(K[a:b], V[a:b], block_size), 0, scale) for a, b in zip(cuts[:-1], cuts[1:])]
    return finish(merge_all(parts)), parts


@dataclass
class StreamRun:
    mode: str          # one of MODES
    seq_len: int
    chunk: int         # tokens per chunk
    latency_s: float   # from the announcement of the last chunk to the output
    ingest_s: float    # of which: reading the last chunk from the file and quantizing it
    work_s: float      # of which: the attention work after that, timed alone (no thread wake-up in it)
    kept_up: bool      # the consumer had finished every earlier chunk when the last one came
    out: np.ndarray


def _producer(kv: np.memmap, K: np.ndarray, V: np.ndarray, chunk: int, interval_s: float,
              announce: queue.Queue, stop: threading.Event) -> None:
    """Write a chunk of K and V into ``kv`` every interval_s and announce ("chunk", index, time written); an error is
    announced as ("error", chunks written, exception), not lost with the thread. The caller unmaps the file once the
    consumer is done: unmapping a large mapping here would stall the consumer's page faults."""
    written = 0
    try:
        for i, a in enumerate(range(0, K.shape[0], chunk)):
            if stop.wait(interval_s):
                return
            b = min(a + chunk, K.shape[0])
            kv[0, a:b] = K[a:b]
            kv[1, a:b] = V[a:b]
            announce.put(("chunk", i, time.perf_counter()))
            written = i + 1
    except BaseException as e:  # noqa: BLE001 - reported to the consumer, which raises it
        announce.put(("error", written, e))


def _next_chunk(announce: queue.Queue, producer: threading.Thread, i: int, n_chunks: int,
                wait_s: float) -> tuple[int, float]:
    """The next (chunk index, time written). A producer that failed, ended early or announced nothing for
    ``wait_s`` seconds becomes a RuntimeError that says which."""
    deadline = time.perf_counter() + wait_s
    while True:
        try:
            msg = announce.get(timeout=0.25)  # wakes at once when a chunk is announced
        except queue.Empty:
            if producer.is_alive() and time.perf_counter() < deadline:
                continue
            try:
                msg = announce.get_nowait()  # announced just before it ended
            except queue.Empty:
                if producer.is_alive():
                    raise RuntimeError(_("the producer thread announced no chunk for {wait_s:.1f} s (the consumer "
                                         "waited for chunk {i} of {n_chunks}): it stalled").format(
                                         wait_s=wait_s, i=i + 1, n_chunks=n_chunks)) from None
                raise RuntimeError(_("the producer thread ended after announcing {i} of {n_chunks} chunks, without "
                                     "an error").format(i=i, n_chunks=n_chunks)) from None
        if msg[0] == "error":
            e = msg[2]
            raise RuntimeError(_("the producer thread failed after writing {msg} of {n_chunks} chunks: "
                                 "{e}: {e2}").format(msg=msg[1], n_chunks=n_chunks, e=type(e).__name__, e2=e)) from e
        return msg[1], msg[2]


def _file_of(path: Path, nbytes: int) -> None:
    """Create the file at its full size with its blocks reserved: a write through a memory map into a sparse
    file on a full disk is a SIGBUS, which would end the notebook's process; a refused reservation is an
    OSError here instead. Where the system cannot reserve (macOS), the file is only sized."""
    with open(path, "wb") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, nbytes)
        except AttributeError:
            f.truncate(nbytes)
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                f.truncate(nbytes)  # this file system cannot reserve blocks
            else:
                raise OSError(e.errno, _("cannot make a file of {nbytes:.1f} MiB in {parent} ({strerror}): pass "
                                         "directory= a folder with room").format(
                                         nbytes=nbytes / 2 ** 20, parent=path.parent, strerror=e.strerror)) from None


def run_stream(q: np.ndarray, K: np.ndarray, V: np.ndarray, mode: str, chunk: int = 1024, interval_s: float = 0.003,
               scale: float | None = None, directory: str | None = None, block_size: int = 4096) -> StreamRun:
    """One run of the streaming experiment over K, V float32 ``[seq_len, head_dim]``: a producer thread writes the
    chunks into a memory-mapped file; this thread reads each one through its own mapping as it is announced and
    appends it to one q8 cache (of few blocks: KVCacheQ8.append touches every block's pointer), then folds it in
    or waits for the last. The garbage collector is paused during the run (as ``timeit`` does), so that no
    collection lands in one run's latency. The caps keep one run short, and every wait is bounded: a producer that
    fails, ends early or stalls (nothing announced for interval_s + STALL_S seconds) becomes a RuntimeError."""
    check.one_of("mode", mode, MODES)
    K = check.float32_array("K", K, (None, None))
    V = check.float32_array("V", V, K.shape)
    T, hd = K.shape
    if T == 0:
        raise ValueError(_("K and V hold no token: give at least one row"))
    check.head_dim(hd)
    q = check.float32_array("q", q, (hd,))
    scale = check.scale(scale, hd)
    chunk = check.integer("chunk", chunk, minimum=1, below=T + 1)
    n_chunks = -(-T // chunk)
    check.at_most(_("the number of chunks (seq_len {T} / chunk {chunk})").format(T=T, chunk=chunk), n_chunks,
                  MAX_STREAM_CHUNKS, _("chunks of one streaming run; use a larger chunk"))
    interval_s = check.finite_float("interval_s", interval_s, minimum=0.0, maximum=MAX_INTERVAL_S)
    if n_chunks * interval_s > MAX_STREAM_S:
        raise ValueError(_("{n_chunks} chunks x interval_s {interval_s:g} s = {n_chunks_interval_s:.0f} s, above "
                           "the cap of {MAX_STREAM_S:g} s per run; use a shorter interval or larger chunks").format(
                           n_chunks=n_chunks, interval_s=interval_s, n_chunks_interval_s=n_chunks * interval_s,
                           MAX_STREAM_S=MAX_STREAM_S))
    block_size = check.integer("block_size", block_size, minimum=1, below=max(T, 4096) + 1)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = Path(tmp) / "kv.f32"
        _file_of(path, 2 * T * hd * 4)
        writer = np.memmap(path, dtype=np.float32, mode="r+", shape=(2, T, hd))  # the file, full size
        kv = np.memmap(path, dtype=np.float32, mode="r", shape=(2, T, hd))  # the consumer's mapping
        announce: queue.Queue = queue.Queue()
        stop = threading.Event()
        producer = threading.Thread(target=_producer, args=(writer, K, V, chunk, interval_s, announce, stop),
                                    name="lessonkit-stream-producer", daemon=True)
        full, done_prev, kept_up = KVCacheQ8(1, hd, block_size), 0.0, True
        passes = ChunkedAttention(_PASSES_OF[mode], q, full, 0, scale) if mode in _PASSES_OF else None
        ffi, lib = native.load()
        gc_was_enabled = gc.isenabled()
        gc.disable()
        producer.start()
        try:
            for i in range(n_chunks):
                j, t_arrived = _next_chunk(announce, producer, i, n_chunks, interval_s + STALL_S)
                if i == n_chunks - 1:
                    kept_up = done_prev <= t_arrived
                t0 = time.perf_counter()
                a, b = j * chunk, min((j + 1) * chunk, T)
                k = np.array(kv[0, a:b]).reshape(b - a, 1, hd)  # read the chunk from the mapped file
                v = np.array(kv[1, a:b]).reshape(b - a, 1, hd)
                full.append(k, v)
                t_ingested = time.perf_counter()
                if passes is not None:
                    passes.fold(b)  # the first pass, on this chunk, now
                    if i == n_chunks - 1:
                        out = passes.finish()  # what needed the last chunk
                elif i == n_chunks - 1:
                    out = call_kernel(ffi, lib, np.empty(hd, np.float32), q, full, 0, scale, KERNELS[mode])
                done_prev = time.perf_counter()
        finally:
            stop.set()  # a producer still sleeping between chunks ends now
            producer.join(timeout=STALL_S)  # bounded: a write stuck on a slow disk is left to finish
            if gc_was_enabled:
                gc.enable()
            del kv, writer
    return StreamRun(mode, T, chunk, done_prev - t_arrived, t_ingested - t0, done_prev - t_ingested, kept_up, out)


class ChunkedAttention:
    """One query's attention over a cache that grows chunk by chunk, with the compiled passes of
    native/flash_attn_q8_two_pass_parts.c (lesson 05b): ``fold(t1)`` runs on the tokens up to t1 what can run
    before the last chunk (the article's token loop, or a two-pass variant's pass 1), ``finish()`` what must wait
    for M (and S) over all tokens. Folded over consecutive ranges, each gives its whole kernel's result
    (``attend(..., backend=variant)``, "neon" for "single"). Every argument is checked before C is called, since
    the cache may grow between folds; the score array is this object's own."""

    def __init__(self, variant: str, q: np.ndarray, cache: KVCacheQ8, kv_head: int = 0, scale: float | None = None):
        check.one_of("variant", variant, PASSES)
        self.variant, self.cache = variant, kv_cache(cache)
        self.q = check.float32_array("q", q, (cache.head_dim,)).copy()  # later edits of q change nothing
        self.kv_head = cache.check_head(kv_head)
        self.scale = check.scale(scale, cache.head_dim)
        self.ffi, self.lib = native.load()
        self.n_folded, self.finished = 0, False
        self._m = self.ffi.new("float *", -1e9)  # the kernels' start: M = -1e9, S = 0
        self._s = self.ffi.new("float *", 0.0)
        self.vkq = np.zeros(cache.head_dim, np.float32)
        self.scores = np.empty(0, np.float32)

    def _args(self):
        qbuf, k, v, ks, vs, unused, *layout = kernel_inputs(self.ffi, self.q, self.cache, self.kv_head, self.lib)
        return qbuf, k, v, ks, vs, (*layout, self.cache.head_dim)

    def fold(self, t1: int) -> None:
        """Run the first pass on tokens [n_folded, t1) of the cache."""
        if self.finished:
            raise RuntimeError(_("finish() has run: this object's passes are done; make a new ChunkedAttention"))
        t0 = self.n_folded
        t1 = check.integer("t1", t1, minimum=t0 + 1)
        if t1 > self.cache.seq_len:
            raise ValueError(_("t1 = {t1} is past the cache's {seq_len} tokens: append the chunk first").format(
                               t1=t1, seq_len=self.cache.seq_len))
        ffi, lib = self.ffi, self.lib
        qbuf, k, v, ks, vs, layout = self._args()
        if self.variant == "single":
            lib.flash_attn_single_pass_fold_q8(out_buffer(ffi, self.vkq), self._m, self._s, qbuf, k, v, ks, vs, t0, t1,
                                               *layout, self.scale)
        elif self.variant == "two_pass_scores":
            if t1 > self.scores.size:  # grown by doubling: a chunk costs one copy now and then
                grown = np.empty(max(t1, 2 * self.scores.size), np.float32)
                grown[:t0] = self.scores[:t0]
                self.scores = grown
            lib.flash_attn_two_pass_scores_pass1_q8(out_buffer(ffi, self.scores), self._m, qbuf, k, ks, t0, t1, *layout,
                                                    self.scale)
        else:
            lib.flash_attn_two_pass_recompute_pass1_q8(self._m, self._s, qbuf, k, ks, t0, t1, *layout, self.scale)
        self.n_folded = t1

    def finish(self) -> np.ndarray:
        """What waits for the last chunk; returns the output float32 [head_dim] over all folded tokens."""
        if self.finished:
            raise RuntimeError(_("finish() has already run once for this object"))
        if self.n_folded == 0:
            raise ValueError(_("no token has been folded in: call fold(t1) first"))
        ffi, lib, T = self.ffi, self.lib, self.n_folded
        out = np.zeros(self.cache.head_dim, np.float32)
        obuf = out_buffer(ffi, out)
        qbuf, k, v, ks, vs, layout = self._args()
        if self.variant == "single":
            s = float(self._s[0])  # segment 4, as the kernel does it: VKQ * (1 / S), 0 without weight
            out[:] = self.vkq * np.float32(1.0 / np.float32(s) if s > 0 else 0.0)
        elif self.variant == "two_pass_scores":
            lib.flash_attn_two_pass_scores_rest_q8(obuf, out_buffer(ffi, self.scores), self._m[0], v, vs, T, *layout)
        else:
            lib.flash_attn_two_pass_recompute_pass2_q8(obuf, qbuf, k, v, ks, vs, self._m[0], self._s[0], T,
                                                       *layout, self.scale)
        self.finished = True
        return out


def work_after_last_chunk(mode: str, seq_len: int, chunk: int, head_dim: int = 128,
                          n_kv_heads: int = 1) -> dict[str, int]:
    """What a kernel must still do once the last chunk of KV has arrived, counted, not timed: K rows scored, V rows
    added, exps (a new max's rescale not counted) and bytes read from the KV (``traffic.bytes_per_token``) and the
    score array (4 bytes per token per pass). The streamed modes are left with their last chunk's first pass and the
    passes that need M (and S) over all tokens; the others run their whole kernel after the last chunk."""
    check.one_of("mode", mode, FAIR_MODES)
    T = check.integer("seq_len", seq_len, minimum=1)
    c = check.integer("chunk", chunk, minimum=1, below=T + 1)
    per = traffic.bytes_per_token(head_dim, n_kv_heads)
    k_tok, v_tok = per["k"], per["kv"] - per["k"]
    last = T - (-(-T // c) - 1) * c  # tokens of the last chunk
    scored, v_rows, exps, score_bytes = {
        "streaming": (last, last, last, 0),
        "two_pass_scores_streamed": (last, T, T, 4 * last + 3 * 4 * T),
        "two_pass_recompute_streamed": (last + T, T, last + T, 0),
        "neon": (T, T, T, 0),
        "two_pass_scores": (T, T, T, 4 * 4 * T),
        "two_pass_recompute": (2 * T, T, 2 * T, 0),
    }[mode]
    return dict(k_rows_scored=scored, v_rows_added=v_rows, exps=exps,
                bytes=scored * k_tok + v_rows * v_tok + score_bytes)


def simulations(configs, saved: Path | str, save: bool | None = None, load_only: bool = False) -> tuple[dict, str]:
    """({config: traffic.Simulated}, a note saying where they came from) of ``configs``, each (variant, seq_len,
    preset_name[, n_kv_heads]) one cold call. Where valgrind is installed and not ``load_only`` (the long ones a
    lesson does not redo in CI) they run now, and with ``save`` (default: LESSONKIT_SAVE_RESULTS=1) are saved to
    ``saved``; elsewhere (macOS) they are read from it. The caps: valgrind runs some 50 times slower than the CPU."""
    if isinstance(configs, (str, bytes)) or not hasattr(configs, "__len__"):
        raise TypeError(_("configs must be a list of (variant, seq_len, preset_name); got {configs}").format(
                          configs=type(configs).__name__))
    check.at_most("len(configs)", len(configs), MAX_SIMULATIONS, _("valgrind simulations of one call"))
    try:
        configs = [(c[0], check.integer("seq_len", c[1], minimum=1), c[2],
                    *(check.integer("n_kv_heads", h, minimum=1, below=33) for h in c[3:]))
                   for c in configs] if all(len(c) in (3, 4) for c in configs) else None
    except (TypeError, ValueError) as e:
        raise type(e)(_("configs must be (variant, seq_len, preset_name[, n_kv_heads]) tuples: "
                        "{e}").format(e=e)) from None
    if configs is None:
        raise ValueError(_("configs must be (variant, seq_len, preset_name[, n_kv_heads]) tuples"))
    for c in configs:
        check.at_most("seq_len", c[1], MAX_SIMULATED_TOKENS, _("tokens of one valgrind simulation"))
    saved = Path(saved)
    if traffic.valgrind_available() and not load_only:
        results = {c: traffic.simulate(c[0], c[1], preset_name=c[2], **({"n_kv_heads": c[3]} if len(c) == 4 else {}))
                   for c in configs}
        version = first_line(["valgrind", "--version"]) or "unknown"
        note = _("simulated now with {valgrind_version} (callgrind --cache-sim=yes)").format(valgrind_version=version)
        if save if save is not None else os.environ.get(SAVE_ENV) == "1":
            saved.parent.mkdir(parents=True, exist_ok=True)
            # merged into what the file holds: a lesson saves its configurations in several calls,
            # and each call replaces only the entries it simulated
            key = lambda r: (r["variant"], r["seq_len"], r["preset"], r.get("n_kv_heads", 1))  # noqa: E731
            fresh = [r.as_dict() for r in results.values()]
            kept = [r for r in (json.loads(saved.read_text())["results"] if saved.is_file() else [])
                    if key(r) not in {key(f) for f in fresh}]
            write_atomic(saved, json.dumps(dict(generated_by="lessonkit.streaming.simulations", valgrind=version,
                                                machine=platform.machine(), results=kept + fresh), indent=1) + "\n")
            note += _("; saved to {name}").format(name=saved.name)
        return results, note
    if not saved.is_file():
        raise RuntimeError(_("{load_only} and there are no saved results in {saved}").format(
                             load_only=_('valgrind was not run') if load_only else _('valgrind is not installed'),
                             saved=saved))
    data = json.loads(saved.read_text())
    names = {f.name for f in fields(traffic.Simulated)}
    sims = [traffic.Simulated(**{k: v for k, v in r.items() if k in names}) for r in data["results"]]
    have = {(s.variant, s.seq_len, s.preset, s.n_kv_heads): s for s in sims}
    have.update({k[:3]: s for k, s in have.items() if k[3] == 1})  # a config may leave out n_kv_heads 1
    if missing := [c for c in configs if c not in have]:
        raise RuntimeError(_("{name} has no saved results for {missing}; run the notebook where valgrind is "
                             "installed with {SAVE_ENV}=1 to save them").format(
                             name=saved.name, missing=missing, SAVE_ENV=SAVE_ENV))
    why = _("loaded as asked") if traffic.valgrind_available() else _("valgrind is not installed here")
    note = _("{why}: these are the results saved in {name} ({get_data} on {get_data2})").format(
             why=why, name=saved.name, get_data=data.get('valgrind', 'valgrind'),
             get_data2=data.get('machine', _('another machine')))
    return {c: have[c] for c in configs}, note
