"""The error of lesson 09's version lowp (flash_attn_q8_v14_lowp) against the article kernel's, case by case
(lessons 07 and 09).

lowp departs from the article in one place: where V meets the softmax weights, each 16 tokens' weights are 14-bit
integer codes with one fp32 step (M and S stay fp32). Both kernels' error is lesson 07's metric (``rel_error``
against float64 attention on the UNQUANTIZED K and V) on the same cache; their ratio says how much lowp adds to what
int8 K, V and Q already cost. ``error_table`` runs ``FULL_CASES`` (the stated study) or ``CI_CASES`` (the tests'
subset), of four kinds: ``normal`` (q, K, V random normal, scale 1/sqrt(head_dim)); ``realistic`` (lesson 02's
made-up decode scores, made the kernel's by ``synthetic.cache_with_scores``'s construction); ``dominant`` (the middle
token scoring 20 above the others' ~N(0, 1)); ``uniform`` (q shrunk 100 times: nearly uniform attention)."""
from __future__ import annotations

import numpy as np

from ..core import validate as check
from ..core.attention import attend
from ..core.language import _
from .precision import rel_error
from .rescales import realistic_scores
from .synthetic import cache_of
from ..display.table import Table

KINDS = ("normal", "realistic", "dominant", "uniform")
# the study: every kind, 1 to 256K tokens, head_dim 64, 128 and 256 (256K at 64 and 128 only: at 256 the
# fp32 K and V alone are 0.5 GB, beside the cache and the float64 reference)
FULL_CASES = tuple((kind, T, hd) for kind in KINDS for T in (1, 17, 1000, 16384, 262144) for hd in (64, 128, 256)
                   if not (T == 262144 and hd == 256))
# The tests' subset: every kind and head_dim, at 1 token (one weight: its code is exact), 1000 and 8192. Why it
# stands for the study: lowp's added error comes from each group of 16 tokens' codes, and depends on how the weights
# are spread within a group (the kind) and on head_dim through V's own quantization error (the article kernel's
# error, the ratio's denominator); beyond a few dozen groups both errors are sums of many independent group terms,
# so their ratio no longer moves with the length (the full study's 16K and 256K rows agree with its 1000-token rows).
CI_CASES = tuple((kind, T, hd) for kind in KINDS for T in (1, 1000, 8192) for hd in (64, 128, 256))
MAX_TOKENS = 1 << 18
BLOCK_SIZE = 64
CHUNK = 1 << 15


def case_inputs(kind: str, seq_len: int, head_dim: int, seed: int = 0):
    """``(q, K, V, scale)`` of one case: float32 ``q [head_dim]``, ``K, V [seq_len, head_dim]``."""
    check.one_of("kind", kind, KINDS)
    seq_len = check.integer("seq_len", seq_len, minimum=1)
    check.at_most("seq_len", seq_len, MAX_TOKENS, _("tokens of one lowp case"))
    head_dim = check.head_dim(head_dim)
    rng = np.random.default_rng([seed, seq_len, head_dim, KINDS.index(kind)])
    V = rng.standard_normal((seq_len, head_dim), dtype=np.float32)
    if kind == "realistic":  # synthetic.cache_with_scores: score of token t = c_t with q all ones, scale 1/hd
        c = realistic_scores(seq_len, seed=seed) if seq_len >= 2 else np.float32([7.0])
        return np.ones(head_dim, np.float32), np.repeat(c[:, None], head_dim, axis=1), V, 1.0 / head_dim
    q = rng.standard_normal(head_dim, dtype=np.float32)
    K = rng.standard_normal((seq_len, head_dim), dtype=np.float32)
    scale = 1.0 / np.sqrt(head_dim)
    if kind == "uniform":
        q *= np.float32(0.01)
    if kind == "dominant":  # its score scale * q.K = 20
        K[seq_len // 2] = q * np.float32(20.0 / (scale * float(q @ q)))
    return q, K, V, float(scale)


def reference(q, K, V, scale: float) -> np.ndarray:
    """float64 attention on the unquantized K, V, ``CHUNK`` tokens at a time (a long case stays small)."""
    q = np.asarray(q, np.float64)
    s = np.concatenate([scale * (K[t:t + CHUNK].astype(np.float64) @ q) for t in range(0, len(K), CHUNK)])
    w = np.exp(s - s.max())
    return sum(w[t:t + CHUNK] @ V[t:t + CHUNK].astype(np.float64) for t in range(0, len(K), CHUNK)) / w.sum()


def case_errors(kind: str, seq_len: int, head_dim: int, seed: int = 0) -> tuple[float, float]:
    """(the article kernel's error, lowp's error) of one case, lesson 07's metric."""
    q, K, V, scale = case_inputs(kind, seq_len, head_dim, seed)
    cache, ref = cache_of(K, V, BLOCK_SIZE), reference(q, K, V, scale)
    return tuple(rel_error(attend(q, cache, 0, scale=scale, backend=b), ref) for b in ("neon", "lowp"))


def error_table(cases=CI_CASES, seed: int = 0) -> Table:
    """One row per case ``(kind, seq_len, head_dim)``: both errors and lowp's / the article kernel's."""
    rows = [(kind, T, hd, article, lowp, lowp / article) for kind, T, hd in cases
            for article, lowp in [case_errors(kind, T, hd, seed)]]
    return Table(rows, header=["kind", "tokens", "head_dim", "article kernel's error", "lowp's error",
                               "lowp / article"],
                 caption="relative L2 error against float64 attention on the unquantized K, V",
                 formats={3: ".2e", 4: ".2e", 5: ".3f"})


def ratio_summary(table: Table) -> tuple[float, float]:
    """(median, worst) of the table's lowp / article ratios."""
    r = np.array([row[-1] for row in table.rows], np.float64)
    return float(np.median(r)), float(r.max())
