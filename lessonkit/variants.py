"""The registry of the kernel's variants (native/fa_variants.h), as Python reads it.

``VARIANTS`` is a tuple of ``Variant(version, name, function, adds)`` in the registry's order:
``version`` is the index ``fa_time_calls`` takes, ``name`` what ``lessonkit.timing.time_kernel``
takes as ``backend=``, ``function`` the C function (article 9-2's signature), ``adds`` the one idea
that version adds. It is parsed from the header rather than read from the built library so that it
exists at import, without a compiler (a student's build may be broken, or not made yet); the smoke
check of every new build (lessonkit/smoke.py) and tests/test_kernel_accuracy.py check that the
library's own table (``fa_variant_name(i)`` ...) says the same, entry by entry."""
from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

HEADER = Path(__file__).resolve().parent.parent / "native" / "fa_variants.h"


class Variant(NamedTuple):
    version: int
    name: str
    function: str
    adds: str


# one X(...) per line: X(version, "name", function, "adds")
_ROW = re.compile(r'^\s*X\(\s*(\d+)\s*,\s*"([^"]+)"\s*,\s*(\w+)\s*,\s*"((?:[^"\\]|\\.)*)"\s*\)\s*\\?\s*$')


def parse(text: str) -> tuple[Variant, ...]:
    """The X rows of FA_VARIANTS in ``text``; ValueError if there are none or their versions are
    not 0, 1, 2, ... in order (fa_time_calls indexes the table by position)."""
    from .language import tr
    rows = tuple(Variant(int(m[1]), m[2], m[3], m[4]) for m in map(_ROW.match, text.splitlines()) if m)
    if not rows:
        raise ValueError(tr("no X(version, name, function, adds) rows in the registry",
                            "注册表里没有 X(version, name, function, adds) 行"))
    if [v.version for v in rows] != list(range(len(rows))):
        raise ValueError(tr(f"registry versions must be 0, 1, 2, ... in order; got {[v.version for v in rows]}",
                            f"注册表的版本号必须按顺序为 0, 1, 2, ...；实际是 {[v.version for v in rows]}"))
    if len({v.name for v in rows}) != len(rows):
        raise ValueError(tr("registry names must be unique", "注册表里的名字不能重复"))
    return rows


VARIANTS: tuple[Variant, ...] = parse(HEADER.read_text(encoding="utf-8"))
BY_NAME: dict[str, Variant] = {v.name: v for v in VARIANTS}

# the registry's "adds" texts in Chinese, by name (the Chinese lessons print them); a version missing
# here (a student's new one) is shown with its English text
ADDS_ZH = {
    "neon": "文章 9-2 给出的内核原样：一个 token 循环（打分、在线更新、累加）",
    "scalar": "标量 C 参考实现，每个版本都与它对照",
    "two_pass_scores": "文章第 3 节：先存下全部分数，再求 exp 与和，最后加权 V",
    "two_pass_recompute": "文章第 3 节：K 读两遍（先求最大值与和，再连同 V 重算分数）",
    "tile": "在 v0 上：先给 FA_TILE 个 token 组成的 tile 打分，再逐个 token 并入",
    "score4": "在 v4 上：四行 K 一起打分，它们的 int32 块和一步归约",
    "tile_rescale": "在 v5 上：每个 tile 只求一次最大值、只对 S 和 VKQ 做一次 rescale，不再每遇到新的最大值就做一次",
    "vexp": "在 v6 上：tile 的权重用 4 通道的 NEON exp 一起算，不再每个 token 调用一次 expf",
    "vkq_regs": "在 v7 上：VKQ 放在寄存器里，每次 32 列，扫过 tile 的各行 V",
    "magic": "在 v8 上：V 的 int8 -> fp32 不用 scvtf，而是把整数加进 1.5 * 2^23 的位模式，再减去 1.5 * 2^23",
    "prefetch": "在 v9 上：软件预取 FA_PREFETCH 个 token 之后的 K 行和 V 行",
    "fast": "最快的单头版本：x86 上用 v8 的步骤，aarch64 上用 v9 的（带魔数加法）",
    "two_pass_scores_fast": "用 fast 的步骤搭成的 v2 三遍版（一次给四行 K 打分、向量 exp、VKQ 放在寄存器里）",
    "two_pass_recompute_fast": "用 fast 的步骤搭成的 v3：K 扫两遍",
}


def adds_text(name: str) -> str:
    """What version ``name`` adds, in the current language (lessonkit.language)."""
    from .language import tr
    v = BY_NAME[name]
    return tr(v.adds, ADDS_ZH.get(name, v.adds))


def from_library(ffi, lib) -> tuple[Variant, ...]:
    """The registry as a built library holds it (fa_variant_count, ...): what VARIANTS must equal."""
    return tuple(Variant(lib.fa_variant_version(i), ffi.string(lib.fa_variant_name(i)).decode(), "",
                         ffi.string(lib.fa_variant_adds(i)).decode()) for i in range(lib.fa_variant_count()))
