"""The exercises of lesson 09 (how fast can it go): the memory floor of one token, the bandwidth that
several cores ask for, and what a faster loop cannot change. Right answers are computed from
lessonkit.roofline, so they follow the head size and the byte count the lesson uses."""
from __future__ import annotations

from .. import roofline
from .core import Choice, Exercise, Wrong, close, field_of, pick, register

# ---------------------------------------------------------------------------- ex1: the floor

L09_GBPS = 20.0  # the bandwidth of the question (a round figure near this machine's probe)
L09_HD = 256     # not the lesson's 128: the lesson works 128 out, the student applies it to another size


def _floor_answer():
    b = roofline.bytes_per_token(L09_HD)
    return b, roofline.floor_ns(b, L09_GBPS)


def _check_floor(answer):
    b, ns = _floor_answer()
    got_b = field_of(answer, "bytes_per_token", int)
    if got_b == 2 * L09_HD:
        raise Wrong(f"{got_b} counts the K and V rows only; each token also has one fp32 K scale and one fp32 V scale")
    if got_b == roofline.bytes_per_token(128):
        raise Wrong(f"{got_b} is the lesson's head_dim 128; this question has head_dim {L09_HD}")
    if got_b == L09_HD + 4:
        raise Wrong(f"{got_b} is one row and one scale; the loop reads K and V for every token")
    if got_b != b:
        raise Wrong(f"bytes_per_token = {got_b}: count the int8 K row, the int8 V row (head_dim bytes each) "
                    "and their two fp32 scales")
    got_ns = field_of(answer, "floor_ns", float)
    if close(got_ns, b * L09_GBPS, 0.01) or close(got_ns, L09_GBPS / b, 0.01):
        raise Wrong(f"floor_ns = {got_ns:g}: 1 GB/s is 1 byte per ns, so ns = bytes / (GB/s)")
    if not close(got_ns, ns, 0.01):
        raise Wrong(f"floor_ns = {got_ns:g} is not {b} bytes / {L09_GBPS:g} GB/s (within 1 %)")
    return f"{b} bytes at {L09_GBPS:g} GB/s take {ns:.1f} ns: no loop on one thread goes below that per token."


floor = Exercise(
    lesson="09", name="floor", title="The memory floor of one token",
    question=(f"One token of one kv head at head_dim {L09_HD}: how many bytes must the loop read at least "
              f"(bytes_per_token: an integer)? At a read bandwidth of {L09_GBPS:g} GB/s, how many ns per token is that "
              "(floor_ns: a number)?"),
    template={"bytes_per_token": ..., "floor_ns": ...},
    check=_check_floor, solution=_floor_answer,
    hint="K row and V row are int8, head_dim values each; each has one float32 scale. 1 GB/s = 1 byte per ns.",
    explain=f"roofline.bytes_per_token({L09_HD}) and roofline.floor_ns(bytes, GB/s) compute it.")

# ---------------------------------------------------------------------------- ex2: four cores

# the board's two cited figures (lessonkit.cycles.BOARD_GBPS one thread, the low end of
# roofline.BOARD_ALLCORE_GBPS all cores): 100 cycles is slower than memory for one core alone and
# faster than the shared DRAM for four, so only the question "all four at once" has one answer
L09_CYCLES, L09_GHZ = 100.0, 2.4
L09_ONE_THREAD, L09_BOARD = 10.8, roofline.BOARD_ALLCORE_GBPS[0]


def _cores_answer():
    one = roofline.demand_gbps(L09_CYCLES, L09_GHZ, 1)
    return one, roofline.demand_gbps(L09_CYCLES, L09_GHZ, 4), "a"


CORES_CHOICES = {
    "a": Choice("memory: the four together ask more than all cores get",
                "each core alone is held by its arithmetic, but four of them share one DRAM and together ask "
                "more bytes per second than it gives: memory sets the pace"),
    "b": Choice("arithmetic: one core asks less than one thread gets",
                "that is true of one core running alone, but the four share one DRAM; add their demands and "
                "compare with the all-core figure"),
    "c": Choice("neither: the L3 cache serves all four cores at once",
                "a long cache does not fit in the 3 MB L3: every K and V byte comes from DRAM once per call"),
}


def _check_cores(answer):
    one, four, right = _cores_answer()
    got1 = field_of(answer, "one_core_gbps", float)
    if close(got1, roofline.bytes_per_token() / L09_CYCLES, 0.02):
        raise Wrong(f"one_core_gbps = {got1:g} divides bytes by cycles; turn cycles into ns first "
                    f"({L09_CYCLES:g} cycles / {L09_GHZ:g} GHz)")
    if not close(got1, one, 0.02):
        raise Wrong(f"one_core_gbps = {got1:g} is not bytes per token / ns per token (within 2 %)")
    got4 = field_of(answer, "four_cores_gbps", float)
    if not close(got4, four, 0.02):
        raise Wrong(f"four_cores_gbps = {got4:g}: four cores each on its own head ask 4 x one core's rate")
    why = pick(answer, "verdict", CORES_CHOICES, right)
    return (f"{one:.1f} GB/s per core (below one thread's {L09_ONE_THREAD:g}), {four:.1f} GB/s for four "
            f"(above all cores' {L09_BOARD:g}): {why}")


four_cores = Exercise(
    lesson="09", name="four_cores", title="Four cores share one memory",
    question=(f"A loop takes {L09_CYCLES:g} cycles per token on one core at {L09_GHZ:g} GHz and reads "
              f"{roofline.bytes_per_token()} bytes per token. How many GB/s does one core ask for "
              "(one_core_gbps: a number)? Four cores, each decoding its own head (four_cores_gbps: a number)? "
              f"The board's memory gives one thread {L09_ONE_THREAD:g} GB/s and all cores together "
              f"{L09_BOARD:g} GB/s. When all four cores run at once, what sets the pace (verdict: a letter)?"),
    template={"one_core_gbps": ..., "four_cores_gbps": ..., "verdict": ...},
    choices=CORES_CHOICES, check=_check_cores, solution=_cores_answer,
    hint="ns per token = cycles / GHz. GB/s = bytes / ns. Cores decoding different heads add up.",
    explain="roofline.demand_gbps(cycles, ghz, cores) computes it.")

# ---------------------------------------------------------------------------- ex3: what cannot change

FLOOR_CHOICES = {
    "a": Choice("the old version already took about bytes / bandwidth per token",
                "at the floor, time is set by the bytes read; fewer instructions do not read fewer bytes"),
    "b": Choice("the compiler removed the new instructions again at -O3",
                "the instruction count did fall (it was measured); the time is held by something else"),
    "c": Choice("timings of long caches are noise on a shared machine",
                "noise moves a timing up and down; it does not hold it at one value for every version"),
}


def _check_floor_choice(answer):
    return pick(answer, "choice", FLOOR_CHOICES, "a")


at_the_floor = Exercise(
    lesson="09", name="at_the_floor", title="When fewer instructions do not help",
    question=("A new version runs half the instructions per token of the one before it. At 1K tokens it is "
              "faster; at 256K tokens both take the same ns per token. Why (choice: a letter)?"),
    template={"choice": ...}, choices=FLOOR_CHOICES, check=_check_floor_choice, solution=lambda: ("a",),
    hint="Compare both times with the dashed line of the plot: bytes per token / read bandwidth.",
    explain="A loop faster than memory waits for memory: only reading fewer bytes helps then.")

register(__name__, [floor, four_cores, at_the_floor])
