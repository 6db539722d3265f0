"""Lesson 06's debugging names in one place (article 9-2, sections 3 and 4), from the modules that hold them:
``kernel_copy`` (edit a copy of the kernel, build it, see), ``debugger`` (gdb or lldb; tier A in batch mode) and
``by_hand`` (the sessions a student types, tier A's among them)."""
from .by_hand import engine_debug_recipe, session_step, show_step, show_tier_a, tier_a_log
from .debugger import (DEBUGGERS, KERNEL, TOKEN_TEXT, breakpoints, debugger_path, observe_generation,
                       records_from_trace, same_records)
from .kernel_copy import (BREAKS, UNMARKED_NAME, Edit, break_kernel, call_kernel, copy_native, edit_line,
                          kernel_weights, softmax_weights, trace_with, unmarked_kernel, unmarked_segments)

__all__ = ["BREAKS", "DEBUGGERS", "KERNEL", "TOKEN_TEXT", "UNMARKED_NAME", "Edit", "break_kernel", "breakpoints",
           "call_kernel", "copy_native", "debugger_path", "edit_line", "engine_debug_recipe", "kernel_weights",
           "observe_generation", "records_from_trace", "same_records", "session_step", "show_step", "show_tier_a",
           "softmax_weights", "tier_a_log", "trace_with", "unmarked_kernel", "unmarked_segments"]
