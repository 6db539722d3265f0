"""The kernel's single pass, segment by segment, from one traced call (lesson 04): a SIMD helper's compile-time
branches and the one compiled, segment 2's scores replayed in float32 from the kernel's own int32 block dots, what
each segment read and computed, and the data-flow figure."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core import quant, toolchain
from ..core import validate as check
from ..core.language import _
from ..display import plotstyle, source
from ..display.table import Table

# the macro that selects each branch of i8x16_dot_s32, by lessonkit.native.simd_paths()["dot"]
DOT_PATH_CONDITION = {"sdot": "__ARM_FEATURE_DOTPROD", "widen": "__aarch64__", "avx2": "__AVX2__", "simde": "#else"}
SEGMENT_COLORS = {1: "#cfe3f7", 2: "#fde2c4", 3: "#d8f0d2", 4: "#ead7f2"}
# (n_kv_heads, head_dim, kv_bs, seq_len, kv_head, zero_q_block): lesson 04's call (a part-filled last
# block, kh_off != 0), one token, the largest head (HD_MAX = 256) with blocks of 7, a Q block of zeros
WALK_CASES = ((2, 128, 16, 1000, 1, False), (1, 32, 1, 1, 0, False), (3, 256, 7, 50, 2, False), (2, 64, 5, 33, 1, True))


@dataclass(frozen=True)
class Branch:
    condition: str  # "#if defined(...)", "#elif ...", "#else"
    first: int      # 1-based line of the directive
    last: int       # 1-based last line of code before the next directive


def preprocessor_branches(first: int, last: int, path: Path | str = source.SIMD_HEADER) -> list[Branch]:
    """The ``#if / #elif / #else`` branches of the first conditional in lines first..last (nested ones stay inside)."""
    lines = Path(path).read_text().splitlines()
    marks, depth = [], 0  # (directive, line) of the first conditional's branches; how deep the #ifs nest
    for n in range(first, last + 1):
        d = lines[n - 1].strip()
        if re.match(r"#\s*if", d):
            depth += 1
            if depth == 1:
                marks.append((d, n))
        elif re.match(r"#\s*(elif|else)", d) and depth == 1:
            marks.append((d, n))
        elif re.match(r"#\s*endif", d):
            if depth == 1:
                marks.append((d, n))
                break
            depth -= 1
    if not marks or not marks[-1][0].lstrip("#").strip().startswith("endif"):
        raise ValueError(_("no complete #if ... #endif between lines {first} and {last}").format(
                           first=first, last=last))
    return [Branch(c, n, marks[i + 1][1] - 1) for i, (c, n) in enumerate(marks[:-1])]


def compiled_branch(branches: list[Branch], dot_path: str) -> int:
    """Index of the branch of ``i8x16_dot_s32`` this build compiled, by ``native.simd_paths()["dot"]``."""
    if dot_path not in DOT_PATH_CONDITION:
        raise ValueError(_("unknown dot path {dot_path!r} (one of: {paths})").format(
                           dot_path=dot_path, paths=", ".join(DOT_PATH_CONDITION)))
    want = DOT_PATH_CONDITION[dot_path]
    for i, b in enumerate(branches):
        if want in b.condition:
            return i
    raise ValueError(_("no branch of the helper is selected by {want}").format(want=want))


def marked_lines(first: int, last: int, marked: tuple[int, int], path: Path | str = source.SIMD_HEADER,
                 mark: str = ">>") -> str:
    """Lines first..last, numbered, with ``mark`` before those in the inclusive range ``marked``."""
    return source.numbered_lines(first, last, path, marked, mark)


def replay_scores(dots, q_scales, k_scales_raw, scale: float, fused: bool = False) -> np.ndarray:
    """Segment 2's float part in numpy float32 from the int32 block dots ``[T, nblk]``. ``fused`` rounds
    ``s + dot32 * qsc[b]`` once, as the fmadd aarch64 GCC emits for that line."""
    dots, qsc = np.asarray(dots, np.int32), np.asarray(q_scales, np.float32)
    s = np.zeros(dots.shape[0], np.float32)
    for b in range(dots.shape[1]):
        if fused:  # an int32 (< 2^24 here) times a float32 is exact in float64
            s = (s.astype(np.float64) + dots[:, b].astype(np.float64) * np.float64(qsc[b])).astype(np.float32)
        else:
            s = s + dots[:, b].astype(np.float32) * qsc[b]
    ks = (np.asarray(k_scales_raw, np.float32) * quant.KVQ_INV).astype(np.float32)
    return (s * ks * np.float32(check.scale(scale))).astype(np.float32)


def score_magnitude(dots, q_scales, k_scales_raw, scale: float) -> np.ndarray:
    """The size of the terms of each score, which sets how far two summation orders can drift apart."""
    terms = np.abs(np.asarray(dots, np.float64) * np.asarray(q_scales, np.float64))
    return terms.sum(axis=1) * np.asarray(k_scales_raw, np.float64) / 127.0 * check.scale(scale)


def score_steps(t: int, dots, q_scales, k_scales_raw, scale: float, kernel_s: float) -> Table:
    """Token t's score step by step as segment 2 computes it (unfused float32), and the kernel's."""
    scale, qsc = check.scale(scale), np.asarray(q_scales, np.float32)
    rows, s = [], np.float32(0)
    for b, d in enumerate(np.asarray(dots, np.int32)[t]):
        term = np.float32(d) * qsc[b]
        s = np.float32(s + term)
        rows.append([b, int(d), qsc[b], term, s])
    ks = np.float32(np.float32(k_scales_raw[t]) * quant.KVQ_INV)
    s_ks = np.float32(s * ks)
    rows += [["x ks", "", f"kscale[t*nkv]/127 = {float(k_scales_raw[t]):.6f}/127", ks, s_ks],
             ["x scale", "", "", np.float32(scale), np.float32(s_ks * np.float32(scale))],
             [_("the kernel's trace.s[{t}]").format(t=t), "", "", "", np.float32(kernel_s)]]
    return Table(rows, header=[_("block b"), "dot32 (int32)", "qsc[b]", "dot32*qsc[b]",
                               _("running s")], formats={2: ".6f", 3: ".6f", 4: ".6f"})


@dataclass
class PassCounts:
    """What one traced call read and computed, counted from its trace and cache."""
    seq_len: int
    head_dim: int
    n_blocks_q: int          # 32-value blocks of Q (and of each K row)
    n_q_quantized: int       # executions of segment 1 (1 per call)
    q_bytes: int             # fp32 Q read by segment 1
    k_rows_read: int         # distinct K rows the kernel read (from the trace's addresses)
    v_rows_read: int
    k_bytes: int             # int8 K codes read: rows x head_dim
    v_bytes: int
    k_scale_bytes: int       # fp32 K scales read, one per token
    v_scale_bytes: int
    block_dots: int          # int32 block dots (each = 2 calls of i8x16_dot_s32)
    expf_calls: int          # expf(M - s) on a new max, expf(s - M) otherwise: one per token
    rescales: int            # tokens that raised M
    rescale_multiplies: int  # rescales x (head_dim VKQ elements + 1 for S *= ms)
    v_fmas: int              # VKQ += V * w: head_dim per token
    divisions: int           # 1 / S, once
    out_multiplies: int      # attn_out[i] = VKQ[i] * (1/S): head_dim, once

    @property
    def kv_bytes(self) -> int:
        return self.k_bytes + self.v_bytes + self.k_scale_bytes + self.v_scale_bytes

    def fields(self) -> dict:
        """What the table's and the figure's messages name: every count, its short name, the bytes in KiB."""
        kibs = {f"kib_{n}_c": f"{getattr(self, n) / 1024:.1f} KiB"
                for n in ("k_bytes", "v_bytes", "k_scale_bytes", "v_scale_bytes", "kv_bytes")}
        return {**vars(self), **kibs, "hd": self.head_dim, "T": self.seq_len, "nblk": self.n_blocks_q,
                "block_dots_c": 2 * self.block_dots}


def pass_counts(trace, cache) -> PassCounts:
    """One traced call over ``cache`` counted: bytes from the distinct row addresses it recorded, dots from its dot
    array, expf calls and rescales from its rescale flags."""
    T, hd = trace.seq_len, cache.head_dim
    k_rows, v_rows = int(np.unique(trace.k_rows).size), int(np.unique(trace.v_rows).size)
    rescales, nq = int(trace.n_rescales), int(trace.n_q_quantized)
    return PassCounts(seq_len=T, head_dim=hd, n_blocks_q=hd // 32, n_q_quantized=nq, q_bytes=4 * hd * nq,
                      k_rows_read=k_rows, v_rows_read=v_rows, k_bytes=k_rows * hd, v_bytes=v_rows * hd,
                      k_scale_bytes=4 * T, v_scale_bytes=4 * T, block_dots=int(trace.dots.size),
                      expf_calls=rescales + int((~trace.rescaled).sum()), rescales=rescales,
                      rescale_multiplies=rescales * (hd + 1), v_fmas=v_rows * hd, divisions=1, out_multiplies=hd)


def cost_table(c: PassCounts, segments: dict) -> Table:
    once, per_token = _("once"), _("per token")
    rows = [(_("1 Q -> int8 (lines {begin}-{end})"), once,
             _("reads Q: {q_bytes} B fp32; {n_blocks_q} max-abs scales, {head_dim} codes; ran {n_q_quantized} "
               "time(s)")),
            (_("2 score (lines {begin}-{end})"), per_token,
             _("reads K: {k_rows_read} rows x {head_dim} B = {kib_k_bytes_c} + scales {kib_k_scale_bytes_c}; "
               "{block_dots} int32 block dots ({block_dots_c} i8x16_dot_s32)")),
            (_("3 online softmax (lines {begin}-{end})"), per_token,
             _("reads V: {v_rows_read} rows x {head_dim} B = {kib_v_bytes_c} + scales {kib_v_scale_bytes_c}; "
               "{expf_calls} expf; {rescales} rescales ({rescale_multiplies} multiplies); {v_fmas} FMAs")),
            (_("4 normalize (lines {begin}-{end})"), once,
             _("{divisions} division (1/S), {out_multiplies} multiplies"))]
    return Table([(name.format(begin=segments[i].begin, end=segments[i].end), runs, what.format(**c.fields()))
                  for i, (name, runs, what) in enumerate(rows, 1)],
                 header=[_("segment"), _("runs"), _("what it read and computed in this call")])


def draw_dataflow(c: PassCounts, segments: dict, ax=None, kv_head: int | None = None, final_S: float | None = None):
    """Boxes and arrows of the single pass with this call's shapes and counts; each segment's box names its lines
    (no legend needed). Drawn in inches on the style's 10-inch width, so the text fits its boxes at 12 pt."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch
    plotstyle.use()
    if ax is None:
        unused, ax = plt.subplots(figsize=(10, 7))
    ax.set(xlim=(0, 10), ylim=(0, 7))
    ax.axis("off")
    f, hd, T, pt = c.fields(), c.head_dim, c.seq_len, plotstyle.MIN_PT
    lines = {n: _("lines {begin_segments_n}-{end_segments_n}").format(
                  begin_segments_n=segments[n].begin, end_segments_n=segments[n].end)
             for n in (1, 2, 3, 4)}

    def box(x, y, w, h, text, seg=None):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05", fc=SEGMENT_COLORS.get(seg, "#f2f2f2"),
                                    ec="0.3", lw=1.2))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=pt)

    def arrow(x0, y0, x1, y1, text=None):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrowstyle="-|>", lw=1.6, color="0.2"))
        if text:
            ax.text((x0 + x1) / 2, y0 + 0.12, text, fontsize=pt, color="0.15", ha="center", va="bottom")

    # segment 1, once
    box(0.1, 6.0, 1.7, 0.8, f"q  fp32 [{hd}]\n{c.q_bytes} B")
    box(2.3, 5.85, 4.5, 1.1, _("segment 1 ({lines}), once\nQ -> int8 codes [{hd}]\n+ {nblk} block scales qsc").format(
                               **f, lines=lines[1]), seg=1)
    arrow(1.85, 6.4, 2.25, 6.4)
    arrow(3.4, 5.8, 3.4, 4.3)
    ax.text(3.55, 5.35, _("int8 Q codes + qsc,\nkept for the whole loop"),
            ha="left", va="center", fontsize=pt, color="0.15")
    # the token loop: segments 2 and 3, once per token
    ax.add_patch(FancyBboxPatch((0.05, 1.75), 9.9, 3.1, boxstyle="round,pad=0.05", fc="none", ec="0.35", lw=1.4,
                                ls="--"))
    ax.text(9.85, 4.55, _("for t = 0 ... {t}: each K and V row read once").format(t=T - 1), fontsize=pt, weight="bold",
            ha="right", va="center")
    box(0.2, 2.1, 1.7, 2.1, _("K row t\nint8 [{hd}]\n= {hd} B\n+ kscale 4 B").format(hd=hd))
    box(2.3, 2.1, 2.3, 2.1, _("segment 2\n({lines})\n{nblk} int32 dots\ns += dot32 * qsc[b]\n"
                              "s *= ks * scale").format(**f, lines=lines[2]), seg=2)
    box(5.0, 2.1, 2.3, 2.1, _("segment 3\n({lines})\nnew max: rescale\n({rescales} of {T} tokens)\n"
                              "1 expf per token").format(**f, lines=lines[3]), seg=3)
    box(7.7, 2.1, 2.15, 2.1, _("VKQ += V row t\n* (vsf * vs)\nV int8 [{hd}]\n= {hd} B\n+ vscale 4 B").format(hd=hd),
        seg=3)
    arrow(1.95, 3.15, 2.25, 3.15)
    arrow(4.65, 3.15, 4.95, 3.15, text="s")
    arrow(7.35, 3.15, 7.65, 3.15, text="w")
    # after the loop: what it read, and segment 4, once
    ax.text(0.1, 0.85, _("K read: {T} x {hd} B = {kib_k_bytes_c} + {kib_k_scale_bytes_c} scales\n          "
                         "{block_dots} int32 block dots\nV read: {T} x {hd} B = {kib_v_bytes_c} + "
                         "{kib_v_scale_bytes_c} scales\n          {expf_calls} expf, {rescales} rescales").format(**f),
            fontsize=pt, color="0.1", va="center")
    sval = "" if final_S is None else f" (S = {final_S:.4g})"
    box(6.3, 0.1, 3.55, 1.35, _("segment 4 ({lines}), once\nx 1/S{sval}: {divisions} division\n+ {out_multiplies} "
                                "multiplies\n-> attn_out fp32 [{hd}]").format(**f, lines=lines[4], sval=sval), seg=4)
    arrow(8.8, 2.0, 8.8, 1.5)
    kh = "" if kv_head is None else _(", kv head {kv_head}").format(kv_head=kv_head)
    ax.set_title(_("One traced call of the kernel (head_dim {hd}, seq_len {T}{kh}):\n{kib_kv_bytes_c} of K, V and "
                   "scales read, once").format(**f, kh=kh), fontsize=13)
    return ax


def check_walkthrough(seed: int = 0):
    """Lesson 04's check on ``WALK_CASES``: each segment of the compiled kernel's traced call against numpy, exact
    where the arithmetic is integer or a maximum, else to float32 rounding (S and VKQ: a thousand roundings)."""
    from ..display.checks import Checks
    from ..core.attention import attend
    from .softmax import online
    from .synthetic import cache_of, cache_with_scores
    rng = np.random.default_rng(seed)
    out = Checks()
    for nkv, hd, kv_bs, T, kh, zero_block in WALK_CASES:
        case = f"hd={hd} kv_bs={kv_bs} T={T} kh={kh}" + (_(" zero Q block") if zero_block else "")
        K, V = (rng.standard_normal((T, nkv, hd), dtype=np.float32) for unused in range(2))
        cache, q = cache_of(K, V, kv_bs), rng.standard_normal(hd, dtype=np.float32)
        if zero_block:
            q[:32] = 0
        scale = float(np.float32(1 / np.sqrt(hd)))
        res, trc = attend(q, cache, kh, scale=scale, trace=True)
        codes, qsc = quant.quantize_q(q)
        kc = cache.k_codes(kh).astype(np.int32).reshape(T, -1, 32)
        k_raw = cache.k_scales(kh)
        m_t = score_magnitude(trc.dots, trc.q_scales, k_raw, scale)
        rep = online(trc.s, cache.dequantized(kh)[1], dtype=np.float32)
        c = pass_counts(trc, cache)
        for name, ok in (
                (_("traced == untraced, bit for bit"),
                 res.tobytes() == attend(q, cache, kh, scale=scale).tobytes()),
                (_("segment 1: Q codes and scales exact"),
                 np.array_equal(trc.q_codes, codes) and np.array_equal(trc.q_scales, qsc) and trc.n_q_quantized == 1),
                (_("segment 2: int32 block dots exact"),
                 np.array_equal(trc.dots, np.einsum("tbi,bi->tb", kc, codes.astype(np.int32).reshape(-1, 32)))),
                (_("segment 2: scores within 1e-6 of their terms"),
                 all((np.abs(replay_scores(trc.dots, trc.q_scales, k_raw, scale, fused=f).astype(np.float64) - trc.s)
                      <= 1e-6 * m_t).all() for f in (False, True))),
                (_("segment 3: M and the rescaled tokens exact"),
                 np.array_equal(trc.M, rep.M) and np.array_equal(trc.rescaled, rep.rescaled)),
                (_("segment 3: S and VKQ within 1e-5 after every token"),
                 bool((np.abs(rep.S - trc.S) <= 1e-5 * trc.S).all()
                      and (np.abs(rep.acc - trc.vkq).max(axis=1) <= 1e-5 * np.abs(trc.vkq).max(axis=1)).all())),
                (_("segment 4: out == VKQ * (1/S), bit for bit"),
                 np.array_equal(trc.vkq[-1] * (np.float32(1) / trc.S[-1]), res)),
                (_("each K and V row read once, one expf per token"),
                 c.k_rows_read == c.v_rows_read == T and c.expf_calls == T)):
            out.add(f"{name} ({case})", ok, _("differs from the numpy replay"))
    low_cache, low_q, low_scale = cache_with_scores(np.array([-2e9, -3e9], np.float32), head_dim=32)
    low_out = attend(low_q, low_cache, 0, scale=low_scale)
    out.add(_("segment 4 guard: scores below -1e9 give zeros, not NaN"), (low_out == 0).all(), f"out {low_out[:4]}")
    return out


@dataclass(frozen=True)
class LineCode:
    compiler: str        # e.g. "aarch64-linux-gnu-gcc 12.2.0"
    flags: str           # the -O3 flags lessonkit.native uses on an ARM machine
    line: int            # the kernel line
    mnemonics: dict      # {mnemonic: count} of the instructions GCC attributes to that line

    def __str__(self) -> str:
        ins = ", ".join(f"{n} {m}" for m, n in sorted(self.mnemonics.items()))
        return _("{compiler} {flags}: line {line} compiles to {ins}").format(
                 compiler=self.compiler, flags=self.flags, line=self.line, ins=ins)


def aarch64_line_code(text: str, segment: int | None = None, function: str = "flash_attn_single_q_q8_neon",
                      dotprod: bool = True) -> LineCode | None:
    """The instructions GCC's line table (``.loc``) gives the kernel line containing ``text`` inside ``function``,
    cross-compiled for aarch64 with lessonkit's ARM flags; None without the cross-compiler (the lesson then says
    so instead of a claim it cannot check)."""
    if shutil.which(toolchain.AARCH64_CC) is None:
        return None
    line = source.find_line(text, segment=segment)
    flags = toolchain.aarch64_flags(dotprod)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "kernel.s"
        subprocess.run([toolchain.AARCH64_CC, *flags, "-g", f"-I{source.KERNEL_FILE.parent}", "-S",
                        str(source.KERNEL_FILE), "-o", str(out)], check=True, capture_output=True, timeout=300)
        asm = out.read_text()
    version = subprocess.run([toolchain.AARCH64_CC, "-dumpfullversion"], capture_output=True, text=True,
                             timeout=60).stdout.strip()
    files = dict(re.findall(r'^\s*\.file\s+(\d+)\s+"([^"]+)"\s*$', asm, flags=re.M))
    index = next(i for i, name in files.items() if Path(name).name == source.KERNEL_FILE.name)
    body = asm.split(f"\n{function}:\n", 1)[1].split(f"\t.size\t{function},", 1)[0]
    counts, here = Counter(), False
    for row in body.splitlines():
        if loc := re.match(r"\s*\.loc\s+(\d+)\s+(\d+)\s", row):
            here = loc.group(1) == index and int(loc.group(2)) == line
        elif here and re.match(r"\t[a-z]", row):
            counts[row.split()[0]] += 1
    return LineCode(f"{toolchain.AARCH64_CC} {version}", " ".join(f for f in flags if f.startswith(("-O", "-march"))),
                    line, dict(counts))
