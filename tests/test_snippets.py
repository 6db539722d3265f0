"""Every code snippet a lesson tells the student to type runs: the inline code and ```python blocks of
each lesson's markdown (both editions) and the code in its exercises' questions and hints (in English
and in Chinese), typed into the lesson's kernel. None may raise NameError, AttributeError,
ImportError or SyntaxError: a name the text gives must exist where the text says it does. Any
other error is the snippet's business (``lk.attend(..., trace=True)`` is refused with a ValueError
because ``...`` is a placeholder; a check answers ``...`` with "Not attempted").

A snippet is recognised by what it is, not by a list: text that parses as Python, is no file path
(``native/q8_simd.h`` parses as a division), and calls or reads an attribute of a name the student
has: ``lk``, ``lessonkit``, ``exercises``, ``np`` or a name the lesson's cells bind (``tr.s``,
``source.numbered_lines(...)``). Math and C in backticks (``exp(s - M)``, ``fa_backend()``) name
nothing the kernel has, and shell and debugger commands (``make lab``, ``p VKQ[0]@hd``) do not
parse; both are left alone. Code in backticks that parses only once its full-width marks (``，``
``（``) are made ASCII is a failure of its own: the student would copy a SyntaxError.
Conventions (docs/new-lesson.md): ``...`` stands for a value the student fills in, and the snippet
runs with it; ``<name>`` stands for a name of the student's choosing, and makes a pattern that is
shown, not run; a name written from ``lessonkit`` (``lessonkit.quant.quantize_q``) is checked after
``import lessonkit``, since it says where the name lives.

Two contexts, as a student meets them:
- after every cell of the lesson (English), in that one kernel: every snippet of the lesson, English
  then (after ``set_language("zh")``) Chinese, in the text's order, so that a step of a question
  that binds a name (``src = workspace.student_native()``) serves the next one; the Chinese edition
  runs the same code as the English one (tests/test_edition.py), so its cells are not run again.
  The kernel is nbval's own: tests/conftest.py adds one item, "snippets after the lesson's cells",
  after the last cell of each English lesson that nbval runs (make test-py runs notebooks/ and tests/
  together), which calls ``run_after_cells`` below. Before, this file ran every cell of each lesson a
  second time in a kernel of its own, about 4 minutes of CPU per test run for cells nbval had just run.
- in a fresh kernel after only the lesson's first code cell (the imports), for each edition: every
  snippet that names only what that cell (and the snippets before it) bound.
The snippets work on a scratch ``my-work/`` (``workspace.WORK_DIR`` moved to a temporary folder), so
that a snippet such as ``lk.workspace.reset_native(confirm=True)`` moves nothing of a developer's
copy; a name a lesson's cell bound before (``src`` of lesson 06) still names what the cell made, as
for the student. The fresh kernels build into this checkout's ``.build/`` (``LESSONKIT_BUILD_DIR``),
where the scratch copy of native/ finds the builds of native/ itself; nbval's kernel builds where the
lessons do, and the tests' shared build cache (tests/conftest.py) spares both a second compile.
"""
from __future__ import annotations

import ast
import builtins
import json
import os
import queue
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import lessonkit
from lessonkit import exercises, punctuation
from lessonkit.language import set_language
from lessonkit.lessons.workspace import LESSON_GLOB

pytest.importorskip("jupyter_client")
from jupyter_client.manager import start_new_kernel  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
LESSONS = sorted(p.stem for p in NOTEBOOKS.glob(LESSON_GLOB))
FATAL = {"NameError", "AttributeError", "ImportError", "ModuleNotFoundError", "SyntaxError", "IndentationError",
         "UnboundLocalError"}
ALWAYS = {"lk", "lessonkit", "exercises", "np"}        # names a snippet may start from in any lesson
# the short module names the lessons use (lk.table, bench.make_inputs ...): lessonkit.ALIASES
SUBMODULES = {name.rsplit(".", 1)[1] for name in lessonkit.ALIASES if name.count(".") == 1} | {"kernels", "exercises"}
CELL_TIMEOUT_S = 900      # a lesson's import cell, which may build and check the kernel first on a slow machine
SNIPPET_TIMEOUT_S = 300
BUILTINS = set(dir(builtins))


# ----------------------------------------------------------------------------- finding the snippets

@dataclass
class Snippet:
    where: str
    code: str


FENCE = re.compile(r"^[ \t]*(```|~~~)[ \t]*(\w*)[^\n]*\n(.*?)^[ \t]*\1", re.S | re.M)
INLINE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
PATH = re.compile(r"^[\w.~-]*(/[\w.*-]+)+/?$|^[\w-]+\.(c|h|py|md|json|cpp|gdb|lldb|ipynb|txt|csv|yaml|so|mo|po)$")
# code written into a question's prose without backticks: an optional assignment, then a dotted name
# from one of the workbook's modules, then its calls and subscripts (scanned for balance below)
BARE = re.compile(r"(?:\b[A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*\s*=\s*)?\b(?P<root>[A-Za-z_]\w*)(?:\.[A-Za-z_]\w*)+")
BARE_IMPORT = re.compile(r"\b(?:from\s+[\w.]+\s+)?import\s+[\w.]+(?:\s*,\s*[\w.]+)*(?:\s+as\s+\w+)?")
BARE_ROOTS = ALWAYS | SUBMODULES | {"ex"}


def _balanced_end(text: str, i: int) -> int:
    """The index after the bracket that closes text[i] ("(" or "["), or -1; quotes are skipped."""
    close, quote, stack = {"(": ")", "[": "]", "{": "}"}, None, []
    for j in range(i, len(text)):
        c = text[j]
        if quote:
            if c == quote:
                quote = None
            continue
        if c in "'\"":
            quote = c
        elif c in close:
            stack.append(close[c])
        elif stack and c == stack[-1]:
            stack.pop()
            if not stack:
                return j + 1
        elif c in ")]}":
            return -1
    return -1


def bare_code(text: str) -> list[str]:
    """Code a question writes in its prose without backticks: ``q = exercises.l01_predict_q()``,
    ``ffi2, lib2 = lk.native.load(src_dir=src)``, ``from lessonkit import debug, workspace``."""
    found = []
    for m in BARE.finditer(text):
        if m.group("root") not in BARE_ROOTS:
            continue
        end = m.end()
        while end < len(text) and text[end] in "([":
            e = _balanced_end(text, end)
            if e < 0:
                break
            end = e
            dotted = re.match(r"\.[A-Za-z_]\w*", text[end:])
            if dotted:
                end += dotted.end()
        found.append((m.start(), text[m.start():end], text[m.start("root"):end]))
    found += [(m.start(), m.group(), m.group()) for m in BARE_IMPORT.finditer(text)]
    out = []
    # an import the text gives beside a step ("src = workspace.student_native() (from lessonkit import
    # workspace)") is typed first
    found.sort(key=lambda f: (not f[1].lstrip().startswith(("import ", "from ")), f[0]))
    for unused, with_target, bare in found:
        for code in (with_target, bare):
            if _parses(code):
                out.append(code)
                break
    return out


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
        return True
    except SyntaxError:
        return False


def candidates(markdown: str) -> list[str]:
    """Fenced blocks (python, or no language) and inline code of a markdown text, in order."""
    found = [(m.start(), m.group(3)) for m in FENCE.finditer(markdown) if m.group(2).lower() in ("", "python", "py")]
    rest = FENCE.sub(lambda m: " " * len(m.group()), markdown)
    found += [(m.start(), m.group(2).strip()) for m in INLINE.finditer(rest)]
    return [code for unused, code in sorted(found)]


def exercise_texts(number: str) -> list[tuple[str, str]]:
    """(where, text) of each question and hint of lesson ``number``'s exercises, in the current language."""
    out = []
    for i, ex in enumerate(exercises.core.REGISTRY.get(number, []), start=1):
        out.append((f"exercises.lesson{number}.ex{i} question", str(ex._text)))
        out.append((f"exercises.lesson{number}.ex{i} hint", str(ex._hint)))
    return out


def names_of(tree: ast.AST) -> tuple[set[str], set[str], set[str]]:
    """(roots, loads, stores): the names a call or attribute access starts from, every name read,
    every name bound (assignments, imports)."""
    roots, loads, stores = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else stores).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            stores.update((a.asname or a.name).split(".")[0] for a in node.names)
        if isinstance(node, (ast.Attribute, ast.Call)):
            base = node.func if isinstance(node, ast.Call) else node.value
            while isinstance(base, (ast.Attribute, ast.Call, ast.Subscript)):
                base = base.func if isinstance(base, ast.Call) else base.value
            if isinstance(base, ast.Name):
                roots.add(base.id)
    return roots, loads, stores


def fullwidth_fixed(code: str) -> str | None:
    """``code`` with its full-width marks made ASCII, when that is what makes it parse."""
    if _parses(code) or not any(punctuation.ascii_for(c) for c in code):
        return None
    fixed = "".join(punctuation.ascii_for(c) or c for c in code)
    return fixed if _parses(fixed) else None


@dataclass
class Found:
    snippets: list[Snippet]
    fullwidth: list[Snippet]      # code that parses only with its full-width marks made ASCII


def lesson_snippets(stem: str, lang: str, bound: set[str]) -> Found:
    """Every snippet of lesson ``stem`` in ``lang`` that starts from a name in ALWAYS or ``bound``, or
    that a snippet before it bound."""
    path = NOTEBOOKS / (f"zh/{stem}.ipynb" if lang == "zh" else f"{stem}.ipynb")
    texts = []
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown":
            texts += [(f"{path.relative_to(REPO)} cell {i}", code) for code in candidates("".join(cell["source"]))]
    before = set_language(lang)
    try:
        for where, text in exercise_texts(stem.split("_")[0]):
            backticked = candidates(text)
            prose = INLINE.sub(lambda m: " " * len(m.group()), text)
            texts += [(f"{where} ({lang})", code) for code in [*backticked, *bare_code(prose)]]
    finally:
        set_language(before)
    found, known = Found([], []), ALWAYS | bound
    for where, code in texts:
        if PATH.match(code.strip()):
            continue
        fixed = fullwidth_fixed(code)
        if fixed is not None:
            if names_of(ast.parse(fixed))[0] & known:
                found.fullwidth.append(Snippet(where, code))
            continue
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue   # a shell or debugger command, C, or a <placeholder> pattern
        roots, unused, stores = names_of(tree)
        is_import = any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(tree))
        if roots & known or is_import:
            found.snippets.append(Snippet(where, code))
            known = known | stores   # a step that binds a name (an import, src = ...) serves the next ones
    return found


# ----------------------------------------------------------------------------- a kernel

class Kernel:
    """A python3 kernel (this interpreter's, as nbval's) in notebooks/, on a scratch my-work/; or
    (``attach``) a kernel already running, nbval's, whose snippets then work on the scratch my-work/."""

    def __init__(self, work_dir: Path):
        env = {**os.environ, "LESSONKIT_BUILD_DIR": str(REPO / ".build"), "MPLBACKEND": "Agg",
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        env.pop("LESSONKIT_LANG", None)
        self.km, self.kc = start_new_kernel(kernel_name="python3", cwd=str(NOTEBOOKS), env=env)
        self._scratch(work_dir, fresh=True)

    @classmethod
    def attach(cls, km, kc, work_dir: Path) -> "Kernel":
        k = cls.__new__(cls)
        k.km, k.kc = km, kc
        k._scratch(work_dir, fresh=False)
        return k

    def _scratch(self, work_dir: Path, fresh: bool) -> None:
        # in a fresh kernel, as a student's, lk.workspace is not bound until lessonkit binds it itself
        self.run(f"""
import pathlib as _p, lessonkit.workspace as _w, lessonkit as _lk
_w.WORK_DIR = _p.Path({str(work_dir)!r}); _w.OLD_DIR = _w.WORK_DIR / "old"; _w.MANIFEST = _w.WORK_DIR / ".copied.json"
{"del _lk.workspace" if fresh else ""}
del _p, _w, _lk
""", must_pass=True)

    def run(self, code: str, timeout: float = SNIPPET_TIMEOUT_S, must_pass: bool = False) -> tuple[str, str] | None:
        """Execute ``code``; (ename, evalue) of the error it raised, or None."""
        msg_id = self.kc.execute(code, store_history=False, allow_stdin=False)
        deadline, error = time.monotonic() + timeout, None
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
            except queue.Empty:
                self.km.interrupt_kernel()
                return ("Timeout", f"no answer in {timeout:.0f} s")
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "error":
                error = (msg["content"]["ename"], msg["content"]["evalue"])
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        if must_pass:
            assert error is None, f"{code[:300]}\nraised {error}"
        return error

    def names(self) -> set[str]:
        msg_id = self.kc.execute("", user_expressions={"n": "sorted(k for k in globals() if not k.startswith('_'))"})
        reply = self.kc.get_shell_msg(timeout=60)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.kc.get_shell_msg(timeout=60)
        return set(ast.literal_eval(reply["content"]["user_expressions"]["n"]["data"]["text/plain"]))

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.fixture
def kernel(tmp_path):
    started = []

    def start():
        started.append(Kernel(tmp_path / "my-work"))
        return started[-1]
    yield start
    for k in started:
        k.close()


def code_cells(stem: str, lang: str = "en") -> list[str]:
    """The lesson's code cells' sources, as nbval runs them."""
    path = NOTEBOOKS / (f"zh/{stem}.ipynb" if lang == "zh" else f"{stem}.ipynb")
    return ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "code"]


def import_cells(stem: str, lang: str) -> list[str]:
    """The lesson's first code cell, its imports; in the Chinese edition, after the cell that
    workbench's edition builder puts first (``lessonkit.set_language("zh")``)."""
    cells = code_cells(stem, lang)
    return cells[:2] if "set_language(" in cells[0] and len(cells) > 1 else cells[:1]


def run_snippets(k: Kernel, snippets: list[Snippet], bound: set[str] | None, seen: set[str]) -> list[str]:
    """Run each snippet not run already (``seen``); with ``bound``, only those that name nothing else
    (and what the snippets before them bound). The failures, one line each."""
    failures = []
    for s in snippets:
        if s.code in seen:
            continue
        unused, loads, stores = names_of(ast.parse(s.code))
        if bound is not None:
            if (loads - stores - BUILTINS - {"lessonkit"}) - bound:
                continue
            bound |= stores
        seen.add(s.code)
        prefix = "import lessonkit\n" if "lessonkit" in loads else ""
        t = time.monotonic()
        error = k.run(prefix + s.code)
        took = time.monotonic() - t
        if took > 20:
            print(f"slow snippet ({took:.0f} s): {s.where}: {s.code!r}")
        if error and (error[0] in FATAL or error[0] == "Timeout"):
            failures.append(f"{s.where}: `{s.code}` -> {error[0]}: {error[1]}")
    return failures


def fullwidth_failures(found: Found) -> list[str]:
    return [f"{s.where}: `{s.code}` -> full-width punctuation in code (SyntaxError when typed)"
            for s in found.fullwidth]


# ----------------------------------------------------------------------------- the two contexts

def run_after_cells(stem: str, km, kc, work_dir: Path) -> None:
    """Every snippet of English lesson ``stem``, then of its Chinese edition, in the kernel (``km``, ``kc``)
    that has just run all the lesson's cells (nbval's: tests/conftest.py); fails with one line per snippet."""
    k = Kernel.attach(km, kc, work_dir)
    t = time.monotonic()
    bound = k.names()
    failures, seen = [], set()
    for lang in ("en", "zh"):   # nbval stops this kernel next: English need not be set back
        if lang == "zh":
            k.run("import lessonkit; lessonkit.set_language('zh')", must_pass=True)
        found = lesson_snippets(stem, lang, bound)
        failures += fullwidth_failures(found) + run_snippets(k, found.snippets, None, seen)
    print(f"{stem}: {len(seen)} snippets {time.monotonic() - t:.0f} s")
    assert len(seen) > 0, f"{stem}: no snippet found (the recognition is broken)"
    assert not failures, "snippets that fail after the lesson's cells:\n" + "\n".join(failures)


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("stem", LESSONS)
def test_snippets_run_after_only_the_import_cell(stem, lang, kernel):
    k = kernel()
    for cell in import_cells(stem, lang):
        assert k.run(cell, timeout=CELL_TIMEOUT_S) is None, f"{stem} ({lang}): its import cell raised"
    bound = k.names()
    found = lesson_snippets(stem, lang, bound)
    failures = fullwidth_failures(found) + run_snippets(k, found.snippets, bound, set())
    assert not failures, "snippets that fail in a fresh kernel after the import cell:\n" + "\n".join(failures)


# ----------------------------------------------------------------------------- the recognition itself

def test_recognition_of_snippets():
    text = ("Run `lk.attend(q, cache, 3, trace=True)`, read `tr.s`; the file `native/q8_simd.h`, the math "
            "`exp(s - M)`, the command `make lab`, gdb's `p VKQ[0]@hd`, a pattern `lk.attend(<q>, cache)`.\n"
            "```python\nsrc = lk.workspace.student_native()\n```\n```sh\nmake test\n```")
    assert candidates(text)[0] == "lk.attend(q, cache, 3, trace=True)"
    assert "src = lk.workspace.student_native()\n" in candidates(text) and "make test\n" not in candidates(text)
    recognised = []
    for code in candidates(text):
        if PATH.match(code.strip()) or not _parses(code):
            continue
        if names_of(ast.parse(code))[0] & (ALWAYS | {"tr"}):
            recognised.append(code)
    assert recognised == ["lk.attend(q, cache, 3, trace=True)", "tr.s", "src = lk.workspace.student_native()\n"]
    assert bare_code("1. src = workspace.student_native()（from lessonkit import debug, workspace）把 native/ 复制") == [
        "from lessonkit import debug, workspace", "src = workspace.student_native()"]
    assert bare_code("then ffi2, lib2 = lk.native.load(src_dir=src) builds it; e.g. the end.") == [
        "ffi2, lib2 = lk.native.load(src_dir=src)"]
    assert fullwidth_fixed("lk.attend(q，cache)") == "lk.attend(q,cache)" and fullwidth_fixed("make lab") is None
    assert fullwidth_fixed("q · k") is None   # a product in prose, not a full-width "."


# ----------------------------------------------------------------------------- the item nbval runs them in

def test_nbval_collects_the_snippets_after_each_english_lesson_only():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                        "notebooks/00_start_here.ipynb", "notebooks/zh/00_start_here.ipynb", "tests/test_nbval_compare.py"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    items = [line for line in r.stdout.splitlines() if "::" in line]
    snippets = [line for line in items if line.endswith("snippets after the lesson's cells")]
    assert len(snippets) == 1 and "zh" not in snippets[0], snippets
    assert items[items.index(snippets[0]) - 1].split("::")[0] == snippets[0].split("::")[0]   # after its cells


def test_run_after_cells_fails_when_the_lessons_names_are_missing(kernel, tmp_path):
    """The item can fail: in a kernel that ran no cell of lesson 01, its snippets meet names its cells
    would have bound (a NameError each), and run_after_cells says which."""
    k = kernel()
    with pytest.raises(AssertionError, match="NameError"):
        run_after_cells("01_quantize_q", k.km, k.kc, tmp_path / "scratch")
