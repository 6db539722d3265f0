"""The Chinese edition of the lessons (``notebooks/zh/``), made from the English lessons and their
translations, so that the two cannot drift apart.

One source for each part of a Chinese lesson, the file ``translations/zh/NN_name.md``:

- its markdown cells: one block per English markdown cell, headed ``<!-- cell ID en:SHA -->``, ID
  the English cell's id, SHA the start of the sha256 of the English text the block translates;
- its code cells: the English lesson's code with the prose filled in, the string literals and
  comments meant for a reader (``is_prose``; a single word too where it labels a table or a plot:
  ``prose``). One block per code cell that has prose, headed
  ``<!-- code ID en:SHA -->`` (SHA of the cell's prose literals, so a change of code alone needs no
  new translation), holding pairs: the English literal as the cell has it on one line, the Chinese
  literal that replaces it on the next, a blank line after::

      <!-- code fd3de2c8 en:0123456789ab -->
      f"max |kernel - float64| = {err.max():.2e}"
      f"max |内核 - float64| = {err.max():.2e}"

      # the compiled kernel
      # 编译好的内核

  The Chinese is a literal of the same kind (a string for a string, a comment for a comment), with
  the same ``{expressions}`` for an f-string, and holds Chinese. A second line ``=`` keeps a string
  the rule reads as prose but which is a name or code (``"hd 32"``). ``tokenize`` finds the literals
  (an f-string is one, whether Python gives it as one token or as FSTRING_START ... FSTRING_END);
- one code cell of its own comes first: ``lessonkit.set_language("zh")``, which makes lessonkit's
  own messages Chinese.

When an English cell changes, ``check`` (and ``tests/test_edition.py``) names the cell: a markdown
block is STALE, with the new English text; a code block is STALE and names each English literal that
has no Chinese and each pair that no literal uses. The translator updates the block and its SHA,
then ``build`` writes the notebook again and ``--execute`` runs it::

    python -m workbench edition check            # what is missing or stale (exit 1 if anything)
    python -m workbench edition skeleton 04      # a translation file to fill in, English in each block
    python -m workbench edition build 04 --execute   # notebooks/zh/04_*.ipynb from the sources, run

``build`` keeps the outputs of code cells whose code did not change (so a markdown edit needs no
re-run); ``--execute`` runs the notebook in Jupyter as the English lessons were run."""
from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import io
import json
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

from lessonkit.core.files import write_atomic  # no half-written file
from lessonkit.lessons.workspace import EDITIONS, LESSON_GLOB, REPO_DIR  # where the editions live (the working copies mirror them)

EN_DIR, ZH_DIR = EDITIONS["en"], EDITIONS["zh"]
SOURCES_DIR = REPO_DIR / "translations" / "zh"
SHA_CHARS = 12
HEADER = re.compile(r"^<!-- (?P<kind>cell|code) (?P<id>[A-Za-z0-9_-]+) en:(?P<sha>[0-9a-f]+)(?P<todo> TODO)? -->$")
LANGUAGE_CELL_ID = "zh-language"
LANGUAGE_CELL = ('import lessonkit\n'
                 'lessonkit.set_language("zh");  # 本课用中文：提示、检查结果、练习和图中文字都是中文')


# ----------------------------------------------------------------------------- reading the sources

def _shown(path: Path, root: Path) -> Path:
    """A path as a message names it: from the repository's top (``root``) when it is inside it."""
    return path.relative_to(root) if path.is_relative_to(root) else path


def read_utf8(path: Path, root: Path = REPO_DIR) -> str:
    """The text of a translation file or a notebook. A byte-order mark (Windows editors write one) is
    dropped, line ends become "\\n" (as Path.read_text makes them), and a file that is not UTF-8 is a
    ValueError naming it and the line, not a bare UnicodeDecodeError."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")  # not utf-8-sig, whose error offsets skip the mark
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ValueError(f"{_shown(path, root)}:{line}: not UTF-8 text ({e.reason} at byte {e.start}); save it as "
                         "UTF-8 (your editor's encoding setting, or iconv -f GBK -t UTF-8 for a GBK file)") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_notebook(path: Path, root: Path = REPO_DIR) -> dict:
    """A notebook's JSON. A file that is not JSON, or not a notebook of cells with ids, is a ValueError
    naming it and what to do, not a bare JSONDecodeError or KeyError."""
    fix = f"restore it (git checkout -- {_shown(path, root)}) or mend it"
    try:
        nb = json.loads(read_utf8(path, root))
    except RecursionError:
        raise ValueError(f"{_shown(path, root)}: nested too deep to be a notebook; {fix}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{_shown(path, root)}:{e.lineno}:{e.colno}: not valid JSON ({e.msg}), so not a notebook; "
                         f"{fix}") from None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list) or not all(isinstance(c, dict) and {"cell_type", "id"} <= c.keys() for c in cells):
        raise ValueError(f"{_shown(path, root)}: not a notebook (nbformat 4.5: a list of cells, each with a cell_type "
                         f"and an id); {fix}")
    return nb


def en_sha(source: str) -> str:
    """The start of the sha256 of an English cell's text: what a translation block records."""
    return hashlib.sha256(source.encode()).hexdigest()[:SHA_CHARS]


def cell_text(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def en_lessons() -> list[Path]:
    return sorted(EN_DIR.glob(LESSON_GLOB))


def zh_path(en_path: Path) -> Path:
    return ZH_DIR / en_path.name


def source_path(en_path: Path) -> Path:
    return SOURCES_DIR / (en_path.stem + ".md")


@dataclass
class Block:
    cell_id: str
    sha: str
    text: str
    todo: bool
    line: int
    kind: str = "cell"  # "cell": a markdown cell's text; "code": a code cell's pairs


def read_blocks(path: Path) -> list[Block]:
    """The blocks of a translation file, in order (text without the header and trailing blank lines)."""
    blocks: list[Block] = []
    lines = read_utf8(path, REPO_DIR).split("\n")
    current = None
    body: list[str] = []
    for n, line in enumerate(lines, start=1):
        m = HEADER.match(line.strip())
        if m:
            if current is not None:
                blocks.append(Block(*current, "\n".join(body).strip("\n"), current_todo, current_line, kind))
            current, current_todo, current_line, body, kind = (m["id"], m["sha"]), bool(m["todo"]), n, [], m["kind"]
        elif current is not None:
            body.append(line)
        elif line.strip():
            raise ValueError(f"{path.name}:{n}: text before the first header ('<!-- cell ID en:SHA -->', "
                             "'<!-- code ID en:SHA -->')")
    if current is not None:
        blocks.append(Block(*current, "\n".join(body).strip("\n"), current_todo, current_line, kind))
    return blocks


def problems(en_path: Path) -> list[str]:
    """What keeps the Chinese twin of ``en_path`` from being built: missing, stale, unfinished or
    orphaned translation blocks and pairs (empty when it can be built)."""
    src = source_path(en_path)
    rel = src.relative_to(REPO_DIR)
    if not src.exists():
        return [f"{rel}: missing (python -m workbench edition skeleton {en_path.stem[:2]} makes one to fill in)"]
    try:
        nb = read_notebook(en_path, REPO_DIR)
        blocks = read_blocks(src)
    except ValueError as e:
        return [str(e)]
    english = {c["id"]: cell_text(c) for c in nb["cells"] if c["cell_type"] == "markdown"}
    code = {c["id"]: cell_text(c) for c in nb["cells"] if c["cell_type"] == "code" and prose(cell_text(c))}
    out = []
    seen = set()
    for b in blocks:
        where = f"{rel}:{b.line} ({b.kind} {b.cell_id})"
        if (b.kind, b.cell_id) in seen:
            out.append(f"{where}: a second block for the same cell")
        seen.add((b.kind, b.cell_id))
        if b.kind == "code":
            if b.cell_id not in code:
                out.append(f"{where}: the English lesson has no code cell with this id and prose in it "
                           "(delete the block)")
            else:
                out += code_problems(rel, b, b.cell_id, code[b.cell_id])
            continue
        if b.cell_id not in english:
            out.append(f"{where}: the English lesson has no markdown cell with this id (delete the block)")
            continue
        if b.sha != en_sha(english[b.cell_id]):
            out.append(f"{where}: STALE, the English cell changed since it was translated; translate its "
                       f"new text and write en:{en_sha(english[b.cell_id])}. The English now:\n"
                       + "\n".join("    | " + ln for ln in english[b.cell_id].split("\n")))
        if b.todo or not b.text.strip():
            out.append(f"{where}: not translated yet (TODO or empty)")
    for cid in english:
        if ("cell", cid) not in seen:
            out.append(f"{rel}: no block for English cell {cid} (en:{en_sha(english[cid])}):\n"
                       + "\n".join("    | " + ln for ln in english[cid].split("\n")))
    for cid, source in code.items():
        if ("code", cid) not in seen:
            out += code_problems(rel, None, cid, source)
    return out


# What the Chinese share of a text leaves out: fenced code, inline code, formulas, link targets, HTML tags
_NOT_PROSE = [re.compile(r"```.*?```", re.S), re.compile(r"`[^`\n]*`"), re.compile(r"\$\$.*?\$\$", re.S),
              re.compile(r"\$[^$\n]+\$"), re.compile(r"\]\([^)]*\)"), re.compile(r"https?://\S+"),
              re.compile(r"<[^>\n]+>")]
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_CJK_PUNCT = re.compile(r"[\u3000-\u303f\uff00-\uffef]")
_LATIN = re.compile(r"[A-Za-z]")


def is_chinese(text: str) -> bool:
    """Whether ``text`` holds a Chinese character or a Chinese punctuation mark."""
    return bool(_HAN.search(text) or _CJK_PUNCT.search(text))
LATIN_LETTERS_PER_CHAR = 5  # a Latin word of about five letters counts as one character


def chinese_share(markdown: str) -> float:
    """The share of Chinese in a text: Chinese characters and Chinese punctuation over those plus
    Latin letters / 5 (a word of about five letters counts as one character), leaving out code,
    formulas, link targets and HTML tags. 1.0 for a text with neither."""
    for pattern in _NOT_PROSE:
        markdown = pattern.sub(" ", markdown)
    han = len(_HAN.findall(markdown)) + len(_CJK_PUNCT.findall(markdown))
    latin = len(_LATIN.findall(markdown)) / LATIN_LETTERS_PER_CHAR
    return han / (han + latin) if han + latin else 1.0


# ----------------------------------------------------------------------------- the code cells' prose

@dataclass
class Literal:
    """A string literal or a comment of a code cell: its exact text and where it sits."""
    text: str
    start: int  # offsets into the cell's text
    end: int
    line: int


def _blank_magics(source: str) -> str:
    """IPython's % and ! lines are not Python: blanked (same length), so that offsets stay."""
    return "\n".join(" " * len(ln) if ln.lstrip().startswith(("%", "!")) else ln for ln in source.split("\n"))


def literals(source: str) -> list[Literal]:
    """The string literals and comments of a cell's code, in order. An f-string is one literal, whether
    ``tokenize`` gives it as one STRING token (Python 3.11) or as FSTRING_START ... FSTRING_END (3.12)."""
    starts = [0]
    for ln in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(ln))

    def offset(pos):
        return starts[pos[0] - 1] + pos[1]

    out, depth, opened = [], 0, None
    fstart, fend = getattr(tokenize, "FSTRING_START", None), getattr(tokenize, "FSTRING_END", None)
    for t in tokenize.generate_tokens(io.StringIO(_blank_magics(source)).readline):
        if t.type == fstart:
            depth += 1
            opened = opened or t
        elif t.type == fend:
            depth -= 1
            if depth == 0:
                out.append(Literal(source[offset(opened.start):offset(t.end)], offset(opened.start),
                                   offset(t.end), opened.start[0]))
                opened = None
        elif depth == 0 and t.type in (tokenize.STRING, tokenize.COMMENT):
            out.append(Literal(t.string, offset(t.start), offset(t.end), t.start[0]))
    return out


_WORD = re.compile(r"(?<![\w.\-/\\%])[A-Za-z]{2,}(?![\w(\-/=])")


def literal_words(text: str) -> str:
    """What a reader reads of a literal: a comment without its ``#``; a string's characters without its
    quotes and without an f-string's ``{fields}``; "" for bytes."""
    if text.startswith("#"):
        return text[1:]
    node = ast.parse(text, mode="eval").body
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else ""
    return "".join(v.value for v in node.values if isinstance(v, ast.Constant))


_LOCATION = re.compile(r"^((upper|lower|center|left|right|best) ?)+$")  # matplotlib's legend places
_SOURCE = re.compile(r"\w\[|/\*|^\s*#\w|[{}]|^(if|for|while|float|int|def|return) ")  # a piece of C or Python


def is_prose(text: str) -> bool:
    """A literal meant for a reader, which the Chinese edition translates: every comment with a word
    in it, and every string with an English word (two letters or more, not part of a name, a path, an
    option or a ``key=``) and a space or a closing colon: "max error:", "kv head 3". Code: a single
    word or name ("neon", "k", ".3f", "-O3", "kv_head", "T={T}"), a legend place ("upper left"), and
    a piece of source text ("kscale[t]", "/* pass 2 */", "#define X", "if (a) {", "float M ="). Any other string
    that stays as it is, the translation file marks kept (``=``)."""
    words = literal_words(text)
    if text.startswith("#"):
        return bool(re.search(r"[A-Za-z]{2,}", words))
    if _LOCATION.match(words.strip()) or _SOURCE.search(words):
        return False
    return bool(_WORD.search(words)) and bool(re.search(r"\s", words) or words.rstrip().endswith(":"))


# Where a single word is a label for a reader too: these keyword arguments, and these calls' arguments
LABEL_KEYWORDS = {"header", "caption", "label", "title", "xlabel", "ylabel"}
LABEL_CALLS = {"set_title", "set_xlabel", "set_ylabel", "suptitle", "labelled", "Table", "text"}


def _label_spans(source: str) -> list[tuple[int, int]]:
    """Where the labels of a cell's code sit (offsets): the strings of LABEL_CALLS' arguments and of
    LABEL_KEYWORDS' values."""
    blank = _blank_magics(source)
    try:
        tree = ast.parse(blank)
    except SyntaxError:
        return []
    lines = blank.splitlines(keepends=True) + [""]
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln))

    def offset(line, col):  # ast's columns count UTF-8 bytes
        return starts[line - 1] + len(lines[line - 1].encode()[:col].decode())

    def name(call):
        return getattr(call.func, "attr", None) or getattr(call.func, "id", None)

    texts = []

    def collect(node):  # the strings a label is made of: not a key, a comparison, another call's argument
        if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            texts.append(node)
        elif isinstance(node, ast.Subscript):
            collect(node.value)
        elif isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):  # not what it runs over
            collect(node.elt)
        elif isinstance(node, ast.Call):
            for a in node.args if name(node) in LABEL_CALLS else []:
                collect(a)
        elif not isinstance(node, ast.Compare):
            for child in ast.iter_child_nodes(node):
                collect(child)

    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in LABEL_KEYWORDS:
            collect(node.value)
        elif isinstance(node, ast.Call) and name(node) in LABEL_CALLS:
            for a in node.args:
                collect(a)
    return [(offset(n.lineno, n.col_offset), offset(n.end_lineno, n.end_col_offset)) for n in texts]


def prose(source: str) -> list[Literal]:
    """The literals of a cell that the Chinese edition translates: those ``is_prose`` says are, and any
    string with a word in it that labels a table or a plot (``header=["tokens", ...]``)."""
    spans = _label_spans(source)

    def label(lit):
        words = literal_words(lit.text)
        return (not lit.text.startswith("#") and any(a <= lit.start < b for a, b in spans)
                and bool(re.search(r"[A-Za-z]{2,}", words)) and not _LOCATION.match(words))
    return [lit for lit in literals(source) if is_prose(lit.text) or label(lit)]


def prose_sha(source: str) -> str:
    """What a code block's SHA records: the cell's prose literals, in order (its code may change)."""
    return en_sha("\n".join(lit.text for lit in prose(source)))


KEEP = "="  # a pair's second line: this literal stays as it is (a name or code the rule reads as prose)


@dataclass
class Pair:
    en: str
    zh: str
    line: int

    @property
    def kept(self) -> bool:
        return self.zh == KEEP


def read_pairs(block: Block) -> list[Pair]:
    """A code block's pairs: the English literal on one line, its Chinese (or ``=``: kept) on the next,
    a blank line between pairs."""
    pairs, group = [], []
    for n, ln in enumerate(block.text.split("\n") + [""], start=block.line + 1):
        if ln.strip():
            group.append((n, ln.strip()))
            continue
        if len(group) == 2:
            pairs.append(Pair(group[0][1], group[1][1], group[0][0]))
        elif group:
            raise ValueError(f"line {group[0][0]} (code {block.cell_id}): a pair is two lines, the English literal "
                             f"then its Chinese, with a blank line after it; found {len(group)}")
        group = []
    return pairs


def _fields(text: str) -> list[str]:
    if text.startswith("#"):
        return []
    node = ast.parse(text, mode="eval").body
    return sorted({ast.dump(v.value) for v in getattr(node, "values", []) if isinstance(v, ast.FormattedValue)})


def pair_problem(p: Pair) -> str | None:
    """Why ``p.zh`` cannot stand in the code for ``p.en`` (None when it can)."""
    if p.kept:
        return None
    try:
        zh = literals(p.zh)
        en = literals(p.en)
    except (SyntaxError, tokenize.TokenError) as e:
        return f"not one Python literal: {e}"
    if len(en) != 1 or en[0].text != p.en:
        return f"the English {p.en!r} is not one string literal or comment"
    if len(zh) != 1 or zh[0].text != p.zh:
        return f"the Chinese {p.zh!r} is not one string literal or comment"
    if p.en.startswith("#") != p.zh.startswith("#"):
        return "a comment translates to a comment, a string to a string"
    if _fields(p.en) != _fields(p.zh):
        return "the Chinese f-string does not use the same {expressions} as the English"
    if not is_chinese(literal_words(p.zh)):
        return "the Chinese has no Chinese in it"
    return None


def code_problems(rel, block: Block | None, cell_id: str, source: str) -> list[str]:
    """What keeps code cell ``cell_id`` from being filled in: a missing block, a stale SHA, a prose
    literal without its pair, a pair nobody uses, a pair that is not a literal of the same kind."""
    needed = list(dict.fromkeys(lit.text for lit in prose(source)))
    sha = prose_sha(source)
    listing = "\n".join("    | " + t for t in needed)
    if block is None:
        return [f"{rel}: no block for the prose of code cell {cell_id} (<!-- code {cell_id} en:{sha} -->):\n" + listing]
    where = f"{rel}:{block.line} (code {cell_id})"
    try:
        pairs = read_pairs(block)
    except ValueError as e:
        return [f"{rel}: {e}"]
    out = []
    if block.sha != sha:
        out.append(f"{where}: STALE, the cell's English strings or comments changed; write en:{sha}. Its prose now:\n"
                   + listing)
    if block.todo:
        out.append(f"{where}: not translated yet (TODO)")
    have = {p.en for p in pairs}
    out += [f"{where}: no Chinese for {t}" for t in needed if t not in have]
    seen = set()
    for p in pairs:
        if p.en in seen:
            out.append(f"{rel}:{p.line} (code {cell_id}): a second pair for {p.en}")
        seen.add(p.en)
        if p.en not in needed:
            out.append(f"{rel}:{p.line} (code {cell_id}): unused, the cell has no prose literal {p.en} "
                       "(delete the pair)")
        elif (why := pair_problem(p)) and not block.todo:
            out.append(f"{rel}:{p.line} (code {cell_id}): {p.en} -> {p.zh}: {why}")
    return out


def fill(source: str, pairs: list[Pair]) -> str:
    """The cell's code with each prose literal replaced by its Chinese."""
    zh = {p.en: p.en if p.kept else p.zh for p in pairs}
    for lit in reversed(prose(source)):
        source = source[:lit.start] + zh[lit.text] + source[lit.end:]
    return source


def skeleton_block(cell: dict) -> str:
    """A TODO block for one English cell: its text, or its prose literals, each paired with itself."""
    t = cell_text(cell)
    if cell["cell_type"] == "markdown":
        return f"<!-- cell {cell['id']} en:{en_sha(t)} TODO -->\n{t}\n"
    pairs = "".join(f"{lit}\n{lit}\n\n" for lit in dict.fromkeys(lit.text for lit in prose(t)))
    return f"<!-- code {cell['id']} en:{prose_sha(t)} TODO -->\n{pairs}"


def skeleton(en_path: Path) -> Path:
    """Write a translation file for ``en_path`` with the English text in TODO blocks (never over an
    existing file)."""
    src = source_path(en_path)
    if src.exists():
        raise FileExistsError(f"{src.relative_to(REPO_DIR)} exists; edit it")
    nb = read_notebook(en_path, REPO_DIR)
    parts = [skeleton_block(c) for c in nb["cells"]
             if c["cell_type"] == "markdown" or (c["cell_type"] == "code" and prose(cell_text(c)))]
    src.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(src, "\n".join(parts))
    return src


def _lines(text: str) -> list[str]:
    """nbformat's way of storing a cell's text: lines with their newlines."""
    return text.splitlines(keepends=True)


def build(en_path: Path) -> Path:
    """Write ``notebooks/zh/<name>``: the English code cells (keeping the outputs of an existing
    twin's cells whose code is unchanged), the translated markdown, the language cell first."""
    found = problems(en_path)
    if found:
        raise ValueError(f"cannot build the Chinese {en_path.name}:\n" + "\n".join(found))
    nb = read_notebook(en_path, REPO_DIR)
    blocks = read_blocks(source_path(en_path))
    zh = {b.cell_id: b for b in blocks if b.kind == "cell"}
    pairs = {b.cell_id: read_pairs(b) for b in blocks if b.kind == "code"}
    old_outputs = {}
    target = zh_path(en_path)
    if target.exists():
        for c in read_notebook(target, REPO_DIR)["cells"]:
            if c["cell_type"] == "code":
                old_outputs[(c["id"], cell_text(c))] = (c.get("outputs", []), c.get("execution_count"))
    outputs, count = old_outputs.get((LANGUAGE_CELL_ID, LANGUAGE_CELL), ([], None))
    cells = [{"cell_type": "code", "execution_count": count, "id": LANGUAGE_CELL_ID, "metadata": {},
              "outputs": outputs, "source": _lines(LANGUAGE_CELL)}]
    for c in nb["cells"]:
        c = copy.deepcopy(c)
        if c["cell_type"] == "markdown":
            c["metadata"] = {**c.get("metadata", {}),
                             "lessonkit": {"translates": c["id"], "en_sha": en_sha(cell_text(c))}}
            c["source"] = _lines(zh[c["id"]].text)
        elif c["cell_type"] == "code":
            c["source"] = _lines(fill(cell_text(c), pairs.get(c["id"], [])))
            c["outputs"], c["execution_count"] = old_outputs.get((c["id"], cell_text(c)), ([], None))
        cells.append(c)
    nb["cells"] = cells
    target.parent.mkdir(parents=True, exist_ok=True)
    # as nbformat writes it (sorted keys), so that a build after a run changes only what changed
    write_atomic(target, json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    return target


def execute(path: Path, timeout: int = 1200) -> None:
    """Run a notebook in place in a Jupyter kernel (from the notebook's folder), as the lessons are
    committed: outputs kept, the per-cell execution timestamps left out."""
    import nbformat
    from nbconvert.preprocessors import ExecutePreprocessor
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    ExecutePreprocessor(timeout=timeout, kernel_name="python3").preprocess(
        nb, {"metadata": {"path": str(path.parent)}})
    for c in nb.cells:
        c.metadata.pop("execution", None)
    text = nbformat.writes(nb)
    write_atomic(path, text if text.endswith("\n") else text + "\n")


def pick(names: list[str]) -> list[Path]:
    """English lessons by number or name prefix ("04", "05b", "04_kernel"); all of them for none."""
    lessons = en_lessons()
    if not names:
        return lessons
    out = []
    for name in names:
        # the exact number or name first ("05" is not "05b"), then a unique start of a name
        hits = ([p for p in lessons if name in (p.stem, p.stem.split("_", 1)[0])]
                or [p for p in lessons if p.stem.startswith(name)])
        if len(hits) != 1:
            raise SystemExit(f"{name!r} names {len(hits)} lessons; use a number such as 04 or 05b")
        out += hits
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench edition", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="list missing and stale translations").add_argument("lessons", nargs="*")
    sub.add_parser("share", help="the Chinese share of each translation's text").add_argument("lessons", nargs="*")
    sub.add_parser("skeleton", help="a translation file to fill in (all missing ones for none)").add_argument("lessons", nargs="*")
    b = sub.add_parser("build", help="write notebooks/zh/ from the English lessons and the translations")
    b.add_argument("lessons", nargs="*")
    b.add_argument("--execute", action="store_true", help="then run each notebook in Jupyter")
    args = ap.parse_args(argv)
    lessons = pick(args.lessons)
    if args.command == "check":
        found = [p for en in lessons for p in problems(en)]
        print("\n".join(found) if found else f"{len(lessons)} Chinese lessons up to date with their English")
        return 1 if found else 0
    if args.command == "share":
        for en in lessons:
            src = source_path(en)
            blocks = read_blocks(src) if src.exists() else []
            whole = chinese_share("\n\n".join(b.text for b in blocks))
            low = [f"{b.cell_id} {chinese_share(b.text):.0%}" for b in blocks if chinese_share(b.text) < 0.6]
            print(f"{en.stem:<28} {whole:6.1%}" + (f"   cells under 60%: {', '.join(low)}" if low else ""))
        return 0
    if args.command == "skeleton":
        for en in lessons:
            if not args.lessons and source_path(en).exists():
                continue  # all missing ones: those that exist are left alone
            print(skeleton(en).relative_to(REPO_DIR))
        return 0
    for en in lessons:
        target = build(en)
        print(target.relative_to(REPO_DIR), flush=True)
        if args.execute:
            execute(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
