"""The exercises of lesson 09 (how fast can it go): the memory floor of one token, the bandwidth that
several cores ask for, and what a faster loop cannot change. Right answers are computed from
lessonkit.roofline, so they follow the head size and the byte count the lesson uses."""
from __future__ import annotations

from .. import roofline
from ..language import Text
from .core import Choice, Exercise, Field, register

# ---------------------------------------------------------------------------- ex1: the floor

L09_GBPS = 20.0  # the bandwidth of the question (a round figure near this machine's probe)
L09_HD = 256     # not the lesson's 128: the lesson works 128 out, the student applies it to another size


UNITS = Text("floor_ns = {got:g}: 1 GB/s is 1 byte per ns, so ns = bytes / (GB/s)",
             "floor_ns = {got:g}：1 GB/s 就是每 ns 1 字节，所以 ns = 字节数 / (GB/s)")


def _floor_facts():
    b = roofline.bytes_per_token(L09_HD)
    return {"bytes_per_token": b, "floor_ns": roofline.floor_ns(b, L09_GBPS), "gbps": L09_GBPS, "hd": L09_HD,
            "times": b * L09_GBPS, "over": L09_GBPS / b}


floor = Exercise(
    "floor", Text("The memory floor of one token", "一个 token 的内存下限"),
    question=Text(f"One token of one kv head at head_dim {L09_HD}: how many bytes must the loop read at least "
                  f"(bytes_per_token: an integer)? At a read bandwidth of {L09_GBPS:g} GB/s, how many ns per token is "
                  "that (floor_ns: a number)?",
                  f"head_dim {L09_HD} 时，一个 kv 头的一个 token：循环至少要读多少字节（bytes_per_token：一个整数）？"
                  f"在 {L09_GBPS:g} GB/s 的读带宽下，这相当于每 token 多少 ns（floor_ns：一个数）？"),
    facts=_floor_facts,
    fields={"bytes_per_token": Field(int, Text(
                "bytes_per_token = {got}: count the int8 K row, the int8 V row (head_dim bytes each) and their two "
                "fp32 scales",
                "bytes_per_token = {got}：请数上 int8 的 K 行、int8 的 V 行（各 head_dim 字节），以及它们的两个 fp32 scale"),
                mistakes=((2 * L09_HD, Text(
                    "{got} counts the K and V rows only; each token also has one fp32 K scale and one fp32 V scale",
                    "{got} 只算了 K 行和 V 行；每个 token 还有一个 fp32 的 K scale 和一个 fp32 的 V scale")),
                          (roofline.bytes_per_token(128), Text(
                    "{got} is the lesson's head_dim 128; this question has head_dim {hd}",
                    "{got} 是课上 head_dim 128 的结果；这道题的 head_dim 是 {hd}")),
                          (L09_HD + 4, Text(
                    "{got} is one row and one scale; the loop reads K and V for every token",
                    "{got} 只是一行加一个 scale；循环对每个 token 都要读 K 和 V")))),
            "floor_ns": Field(float, Text(
                "floor_ns = {got:g} is not {bytes_per_token} bytes / {gbps:g} GB/s (within 1 %)",
                "floor_ns = {got:g} 不等于 {bytes_per_token} 字节 / {gbps:g} GB/s（允许 1 % 误差）"), rtol=0.01,
                mistakes=((lambda times, **_: times, UNITS), (lambda over, **_: over, UNITS)))},
    correct=Text("{bytes_per_token} bytes at {gbps:g} GB/s take {floor_ns:.1f} ns: no loop on one thread goes below "
                 "that per token.",
                 "{bytes_per_token} 字节在 {gbps:g} GB/s 下要 {floor_ns:.1f} ns：单线程上没有哪个循环能让每个 token "
                 "低于这个时间。"),
    hint=Text("K row and V row are int8, head_dim values each; each has one float32 scale. 1 GB/s = 1 byte per ns.",
              "K 行和 V 行都是 int8，各有 head_dim 个值；每行还有一个 float32 scale。1 GB/s = 每 ns 1 字节。"),
    explain=Text(f"roofline.bytes_per_token({L09_HD}) and roofline.floor_ns(bytes, GB/s) compute it.",
                 f"roofline.bytes_per_token({L09_HD}) 和 roofline.floor_ns(bytes, GB/s) 能算出它。"))

# ---------------------------------------------------------------------------- ex2: four cores

# the board's two cited figures (lessonkit.cycles.BOARD_GBPS one thread, the low end of
# roofline.BOARD_ALLCORE_GBPS all cores): 100 cycles is slower than memory for one core alone and
# faster than the shared DRAM for four, so only the question "all four at once" has one answer
L09_CYCLES, L09_GHZ = 100.0, 2.4
L09_ONE_THREAD, L09_BOARD = 10.8, roofline.BOARD_ALLCORE_GBPS[0]


def _cores_facts():
    one = roofline.demand_gbps(L09_CYCLES, L09_GHZ, 1)
    return {"one_core_gbps": one, "four_cores_gbps": roofline.demand_gbps(L09_CYCLES, L09_GHZ, 4), "verdict": "a",
            "per_cycle": roofline.bytes_per_token() / L09_CYCLES, "cycles": L09_CYCLES, "ghz": L09_GHZ,
            "one_thread": L09_ONE_THREAD, "board": L09_BOARD}


CORES_CHOICES = {
    "a": Choice(Text("memory: the four together ask more than all cores get",
                     "内存：四个核合起来要的比全部核能拿到的还多"),
                Text("each core alone is held by its arithmetic, but four of them share one DRAM and together ask "
                     "more bytes per second than it gives: memory sets the pace",
                     "每个核单独跑时被它的算术拖住，但四个核共用一块 DRAM，合起来每秒要的字节比它能给的多："
                     "决定速度的是内存")),
    "b": Choice(Text("arithmetic: one core asks less than one thread gets",
                     "算术：一个核要的比单线程能拿到的少"),
                Text("that is true of one core running alone, but the four share one DRAM; add their demands and "
                     "compare with the all-core figure",
                     "一个核单独跑时确实如此，但四个核共用一块 DRAM；把它们的需求加起来，再和全核带宽比")),
    "c": Choice(Text("neither: the L3 cache serves all four cores at once",
                     "都不是：L3 缓存同时供给四个核"),
                Text("a long cache does not fit in the 3 MB L3: every K and V byte comes from DRAM once per call",
                     "长的 KV 缓存装不进 3 MB 的 L3：每次调用，K 和 V 的每个字节都要从 DRAM 读一次")),
}


four_cores = Exercise(
    "four_cores", Text("Four cores share one memory", "四个核共用一块内存"),
    question=Text(f"A loop takes {L09_CYCLES:g} cycles per token on one core at {L09_GHZ:g} GHz and reads "
                  f"{roofline.bytes_per_token()} bytes per token. How many GB/s does one core ask for "
                  "(one_core_gbps: a number)? Four cores, each decoding its own head (four_cores_gbps: a number)? "
                  f"The board's memory gives one thread {L09_ONE_THREAD:g} GB/s and all cores together "
                  f"{L09_BOARD:g} GB/s. When all four cores run at once, what sets the pace (verdict: a letter)?",
                  f"一个循环在 {L09_GHZ:g} GHz 的一个核上每 token 要 {L09_CYCLES:g} 个周期，每 token 读 "
                  f"{roofline.bytes_per_token()} 字节。一个核要多少 GB/s（one_core_gbps：一个数）？"
                  "四个核各解码自己的头呢（four_cores_gbps：一个数）？"
                  f"开发板的内存给单线程 {L09_ONE_THREAD:g} GB/s，给全部核合计 {L09_BOARD:g} GB/s。"
                  "四个核同时跑时，决定速度的是什么（verdict：一个字母）？"),
    facts=_cores_facts,
    fields={"one_core_gbps": Field(float, Text(
                "one_core_gbps = {got:g} is not bytes per token / ns per token (within 2 %)",
                "one_core_gbps = {got:g} 不等于每 token 字节数 / 每 token ns（允许 2 % 误差）"), rtol=0.02,
                mistakes=((lambda per_cycle, **_: per_cycle, Text(
                    "one_core_gbps = {got:g} divides bytes by cycles; turn cycles into ns first ({cycles:g} cycles / "
                    "{ghz:g} GHz)",
                    "one_core_gbps = {got:g} 是字节数除以周期数；请先把周期换成 ns（{cycles:g} 周期 / {ghz:g} GHz）")),)),
            "four_cores_gbps": Field(float, Text(
                "four_cores_gbps = {got:g}: four cores each on its own head ask 4 x one core's rate",
                "four_cores_gbps = {got:g}：四个核各算自己的头，要的带宽是一个核的 4 倍"), rtol=0.02),
            "verdict": Field(CORES_CHOICES)},
    correct=Text("{one_core_gbps:.1f} GB/s per core (below one thread's {one_thread:g}), {four_cores_gbps:.1f} GB/s "
                 "for four (above all cores' {board:g}): {why}",
                 "每个核 {one_core_gbps:.1f} GB/s（低于单线程的 {one_thread:g}），四个核 {four_cores_gbps:.1f} GB/s"
                 "（高于全核的 {board:g}）：{why}"),
    hint=Text("ns per token = cycles / GHz. GB/s = bytes / ns. Cores decoding different heads add up.",
              "每 token ns = 周期数 / GHz。GB/s = 字节数 / ns。解码不同头的各个核，需求要加起来。"),
    explain=Text("roofline.demand_gbps(cycles, ghz, cores) computes it.",
                 "roofline.demand_gbps(cycles, ghz, cores) 能算出它。"))

# ---------------------------------------------------------------------------- ex3: what cannot change

FLOOR_CHOICES = {
    "a": Choice(Text("the old version already took about bytes / bandwidth per token",
                     "旧版本每 token 的时间已经约等于 字节数 / 带宽"),
                Text("at the floor, time is set by the bytes read; fewer instructions do not read fewer bytes",
                     "到了下限，时间由读的字节数决定；指令少了，读的字节并没有少")),
    "b": Choice(Text("the compiler removed the new instructions again at -O3",
                     "编译器在 -O3 下又把新指令删掉了"),
                Text("the instruction count did fall (it was measured); the time is held by something else",
                     "指令数确实降了（这是测出来的）；拖住时间的是别的东西")),
    "c": Choice(Text("timings of long caches are noise on a shared machine",
                     "在共享机器上，长 KV 缓存的计时只是噪声"),
                Text("noise moves a timing up and down; it does not hold it at one value for every version",
                     "噪声让计时忽高忽低；它不会让每个版本都停在同一个值上")),
}


at_the_floor = Exercise(
    "at_the_floor", Text("When fewer instructions do not help", "指令少了却不见快"),
    question=Text("A new version runs half the instructions per token of the one before it. At 1K tokens it is "
                  "faster; at 256K tokens both take the same ns per token. Why (choice: a letter)?",
                  "一个新版本每 token 的指令数只有前一版的一半。在 1K token 时它更快；在 256K token 时两者"
                  "每 token 的 ns 一样。为什么（choice：一个字母）？"),
    facts={"choice": "a"}, fields={"choice": Field(FLOOR_CHOICES)},
    hint=Text("Compare both times with the dashed line of the plot: bytes per token / read bandwidth.",
              "把两个时间都和图里的虚线比一比：每 token 字节数 / 读带宽。"),
    explain=Text("A loop faster than memory waits for memory: only reading fewer bytes helps then.",
                 "比内存快的循环只能等内存：这时只有少读字节才有用。"))

register(__name__, [floor, four_cores, at_the_floor])
