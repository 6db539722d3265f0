"""Lesson 06's debugging names in one place (article 9-2, sections 3 and 4), from the modules that
hold them: ``kernel_copy`` (edit a copy of the kernel, build it, see), ``debugger`` (tier A under
gdb or lldb in batch mode) and ``by_hand`` (the sessions a student types, tier A's among them). The aarch64 build under
qemu and gdb-multiarch is ``make debug-aarch64``; the transcripts of the by-hand sessions are made
by ``tests/transcripts.py``."""
from .by_hand import (DEBUGGERS, KERNEL, debugger_path, engine_debug_recipe, session_commands, session_step, show_step,
                      show_tier_a, tier_a_log)
from .debugger import TOKEN_TEXT, breakpoints, observe_generation, records_from_trace, same_records
from .kernel_copy import (BREAKS, UNMARKED_NAME, Edit, break_kernel, call_kernel, copy_native, edit_line,
                          kernel_weights, softmax_weights, trace_with, unmarked_kernel, unmarked_segments)

__all__ = ["BREAKS", "DEBUGGERS", "KERNEL", "TOKEN_TEXT", "UNMARKED_NAME", "Edit", "break_kernel", "breakpoints",
           "call_kernel", "copy_native", "debugger_path", "edit_line", "engine_debug_recipe",
           "kernel_weights", "observe_generation", "records_from_trace", "same_records",
           "session_commands", "session_step", "show_step", "show_tier_a", "softmax_weights", "tier_a_log", "trace_with", "unmarked_kernel",
           "unmarked_segments"]
