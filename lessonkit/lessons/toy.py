"""A toy generation, so that "run one generation" means something (lesson 06): one attention layer with random
weights (fixed seed), query heads sharing kv heads as under GQA, greedy decoding. Each step appends one token's K
and V to a ``KVCacheQ8``, then calls the compiled kernel once per query head over the whole cache: the calls of a
real decoder, with tokens that mean nothing."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core import native
from ..core import validate as check
from ..core.cache import KVCacheQ8
from ..core.attention import KERNELS, call_kernel
from ..core.language import _
from ..core.trace import FIELDS, run_traced

MAX_STEPS = 4096            # steps of one generation: one cache row and n_q_heads kernel calls each
MAX_WEIGHTS = 1 << 26       # float32 weights of the toy model (256 MiB)
TRACE_BYTES = 512 << 20     # the traces generate(trace=True) keeps
KERNEL = KERNELS["neon"]    # flash_attn_single_q_q8_neon, the kernel lesson 06 debugs


@dataclass(frozen=True)
class ToyConfig:
    """Defaults: 2 kv heads x 2 query heads each = 4 kernel calls per step."""
    vocab: int = 48
    d_model: int = 64
    n_kv_heads: int = 2
    group: int = 2          # query heads per kv head (GQA group)
    head_dim: int = 32
    block_size: int = 4     # small, so that a short generation already spans several cache blocks
    seed: int = 0

    def __post_init__(self):
        for name in ("vocab", "d_model", "n_kv_heads", "group", "block_size"):
            check.integer(f"ToyConfig.{name}", getattr(self, name), minimum=1)
        check.integer("ToyConfig.seed", self.seed)
        check.head_dim(self.head_dim)
        if self.d_model % 2:
            raise ValueError(_("ToyConfig.d_model must be even (sine and cosine position codes); got {d_model}").format(
                               d_model=self.d_model))
        check.at_most("the toy model's weights", self.n_weights, MAX_WEIGHTS, "float32 weights of the toy model")
        check.at_most("ToyConfig.block_size", self.block_size, MAX_STEPS, "tokens per block of a toy cache")
        check.at_most("the toy model's query heads (n_kv_heads x group)", self.n_q_heads, 64,
                      "query heads of a toy model: each step calls the kernel once per head")

    @property
    def n_q_heads(self) -> int:
        return self.n_kv_heads * self.group

    @property
    def n_weights(self) -> int:   # embedding, projections, unembedding
        q, kv = self.n_q_heads * self.head_dim, self.n_kv_heads * self.head_dim
        return 2 * self.vocab * self.d_model + self.d_model * (q + 2 * kv) + q * self.d_model


def checked_config(config) -> ToyConfig:
    config = ToyConfig() if config is None else config
    if not isinstance(config, ToyConfig):
        raise TypeError(_("config must be a lessonkit.toy.ToyConfig; got {config}").format(
                          config=type(config).__name__))
    return config


@dataclass(frozen=True)
class KernelCall:
    step: int      # generation step (0-based): the token fed at this step sits at position `step`
    q_head: int
    kv_head: int   # q_head // group: the kv head this query head shares
    seq_len: int   # tokens in the cache at this call = the kernel's seq_len argument


@dataclass
class Generation:
    prompt: list[int]
    tokens: list[int]                      # the generated ids, len == n_tokens
    calls: list[KernelCall]                # every kernel call, in the order it was made
    config: ToyConfig
    traces: list | None = None             # lessonkit.trace.Trace per call, with trace=True
    kernel: str = "fast"                   # "fast", "debug", "traced" or "copy"
    outputs: list[np.ndarray] = field(default_factory=list, repr=False)  # kernel output per call
    cache: KVCacheQ8 | None = field(default=None, repr=False)           # the cache after the last step


class ToyModel:
    """Random weights from ``config.seed``; float32 throughout."""

    def __init__(self, config: ToyConfig = ToyConfig()):
        c = self.config = checked_config(config)
        rng = np.random.default_rng(c.seed)

        def w(rows, cols):
            return (rng.standard_normal((rows, cols)) / math.sqrt(rows)).astype(np.float32)

        self.embedding = rng.standard_normal((c.vocab, c.d_model)).astype(np.float32)
        self.wq = w(c.d_model, c.n_q_heads * c.head_dim)
        self.wk = w(c.d_model, c.n_kv_heads * c.head_dim)
        self.wv = w(c.d_model, c.n_kv_heads * c.head_dim)
        self.wo = w(c.n_q_heads * c.head_dim, c.d_model)
        self.unembedding = w(c.d_model, c.vocab)   # untied: a tied one would mostly repeat the input
        self.scale = 1.0 / math.sqrt(c.head_dim)

    def position(self, pos: int) -> np.ndarray:
        """Sinusoidal, so that the same token at two positions differs."""
        d = self.config.d_model
        freq = 1.0 / (100.0 ** (np.arange(0, d, 2) / d))
        p = np.zeros(d, np.float32)
        p[0::2], p[1::2] = np.sin(pos * freq), np.cos(pos * freq)
        return p

    def step(self, token: int, pos: int, cache: KVCacheQ8, kernel) -> tuple[int, list[np.ndarray]]:
        """Append the token's K, V to the cache, attend every query head through ``kernel(q, cache, kv_head,
        scale)``: (greedy next token, the heads' outputs)."""
        c = self.config
        x = (self.embedding[token] + self.position(pos)).astype(np.float32)
        q = (x @ self.wq).reshape(c.n_q_heads, c.head_dim)
        k = (x @ self.wk).reshape(c.n_kv_heads, c.head_dim)
        v = (x @ self.wv).reshape(c.n_kv_heads, c.head_dim)
        cache.append(np.ascontiguousarray(k), np.ascontiguousarray(v))
        heads = [kernel(np.ascontiguousarray(q[h]), cache, h // c.group, self.scale) for h in range(c.n_q_heads)]
        y = x + np.concatenate(heads).astype(np.float32) @ self.wo
        return int(np.argmax(np.tanh(y) @ self.unembedding)), heads


def trace_bytes(n_steps: int, config: ToyConfig, fields=FIELDS) -> int:
    """Of the traces of ``n_steps`` steps: step i's calls record i + 1 tokens each."""
    hd, nblk = config.head_dim, config.head_dim // 32
    per_token = {"dots": 4 * nblk, "k_rows": 8, "v_rows": 8, "s": 4, "M": 4, "S": 4, "ms": 4, "vkq": 4 * hd}
    fixed = {"q_codes": hd, "q_scales": 4 * nblk}
    tokens = config.n_q_heads * n_steps * (n_steps + 1) // 2
    return (tokens * sum(per_token.get(f, 0) for f in fields)
            + n_steps * config.n_q_heads * sum(fixed.get(f, 0) for f in fields))


def generate(n_tokens: int, prompt=(0,), config: ToyConfig | None = None, debug: bool = False,
             src_dir: Path | str | None = None, trace: bool = False, verbose: bool = True,
             trace_fields=None, verify: str = "results") -> Generation:
    """Step ``i`` feeds token ``i`` of (prompt + generated), so each of its ``n_q_heads`` calls has ``seq_len =
    i + 1``. The kernel: the fast build; ``debug=True`` the ``-O0 -g`` one (a debugger attached to this process
    stops in it); ``src_dir`` a copy of native/ (``verify`` as in ``native.load``); ``trace=True`` the traced
    build, one Trace per call of the fields ``trace_fields``, at most TRACE_BYTES."""
    n_tokens = check.at_most("n_tokens", check.integer("n_tokens", n_tokens, minimum=1), MAX_STEPS,
                             "steps of one toy generation")
    if isinstance(prompt, (str, bytes)) or not hasattr(prompt, "__len__"):
        raise TypeError(_("prompt must be a list of token ids; got {prompt}").format(prompt=type(prompt).__name__))
    check.at_most("len(prompt)", len(prompt), MAX_STEPS - n_tokens + 1,
                  f"steps of one toy generation: len(prompt) + n_tokens - 1 <= {MAX_STEPS}")
    prompt = [check.integer("a prompt id", t, minimum=0) for t in prompt]
    config = checked_config(config)
    if not prompt or not all(t < config.vocab for t in prompt):
        raise ValueError(_("prompt must be a non-empty list of ids in [0, {vocab})").format(vocab=config.vocab))
    debug, trace, verbose = check.flag("debug", debug), check.flag("trace", trace), check.flag("verbose", verbose)
    if trace and (debug or src_dir is not None):
        raise ValueError(_("trace=True runs the traced build of native/; leave debug and src_dir unset"))
    if trace_fields is not None and not trace:
        raise ValueError(_("trace_fields chooses what trace=True records: pass trace=True too"))
    traces = [] if trace else None
    if trace:
        fields = FIELDS if trace_fields is None else tuple(trace_fields)
        n_steps = len(prompt) + n_tokens - 1
        check.memory(f"the traces of {n_steps} steps ({', '.join(fields)})", trace_bytes(n_steps, config, fields),
                     TRACE_BYTES, _("generate fewer tokens, or keep fewer fields, e.g. trace_fields=('s', 'M', 'S')"))

        def kernel(q, cache, kv_head, scale):
            out = np.empty(cache.head_dim, np.float32)
            traces.append(run_traced(out, q, cache, kv_head, scale, fields=fields))
            return out
        kind = "traced"
    else:
        ffi, lib = native.library(*native.load(debug=debug, src_dir=src_dir, verify=verify), (KERNEL,))

        def kernel(q, cache, kv_head, scale):
            return call_kernel(ffi, lib, np.empty(cache.head_dim, np.float32), q, cache, kv_head, scale)
        kind = "copy" if src_dir is not None else "debug" if debug else "fast"

    model = ToyModel(config)
    cache = KVCacheQ8(config.n_kv_heads, config.head_dim, config.block_size)
    seq, calls, outputs = list(prompt), [], []
    for step in range(len(prompt) + n_tokens - 1):
        nxt, heads = model.step(seq[step], step, cache, kernel)
        calls += [KernelCall(step, h, h // config.group, cache.seq_len) for h in range(config.n_q_heads)]
        outputs += heads
        if step + 1 >= len(prompt):   # past the prompt: the prediction is the next token
            seq.append(nxt)
    generated = seq[len(prompt):]
    if verbose:
        print(_("generated token ids: {generated}").format(generated=generated), flush=True)
    return Generation(prompt, generated, calls, config, traces, kind, outputs, cache)
