"""The Chinese edition of the lessons (``notebooks/zh/``), made from the English lessons and their
translations, so that the two cannot drift apart.

One source for each part of a Chinese lesson:

- its code cells are the English lesson's, copied (the same code, run in Chinese);
- its markdown cells come from ``translations/zh/NN_name.md``, one block per English markdown
  cell, headed ``<!-- cell ID en:SHA -->``: ID is the English cell's id, SHA the start of the
  sha256 of the English text the block translates;
- one code cell of its own comes first: ``lessonkit.set_language("zh")``.

When an English markdown cell changes, its SHA no longer matches: ``check`` (and
``tests/test_edition.py``) names the cell and shows its new English text; the translator updates the
block and its SHA, then ``build`` writes the notebook again and ``--execute`` runs it::

    python -m lessonkit.edition check            # what is missing or stale (exit 1 if anything)
    python -m lessonkit.edition skeleton 04      # a translation file to fill in, English in each block
    python -m lessonkit.edition build 04 --execute   # notebooks/zh/04_*.ipynb from the sources, run

``build`` keeps the outputs of code cells whose code did not change (so a translation edit needs no
re-run); ``--execute`` runs the notebook in Jupyter as the English lessons were run."""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .workspace import EDITIONS, LESSON_GLOB, REPO_DIR  # where the editions live (the working copies mirror them)

EN_DIR, ZH_DIR = EDITIONS["en"], EDITIONS["zh"]
SOURCES_DIR = REPO_DIR / "translations" / "zh"
SHA_CHARS = 12
HEADER = re.compile(r"^<!-- cell (?P<id>[A-Za-z0-9_-]+) en:(?P<sha>[0-9a-f]+)(?P<todo> TODO)? -->$")
LANGUAGE_CELL_ID = "zh-language"
LANGUAGE_CELL = ('import lessonkit\n'
                 'lessonkit.set_language("zh");  # 本课用中文：提示、检查结果、练习和图中文字都是中文')


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


def read_blocks(path: Path) -> list[Block]:
    """The blocks of a translation file, in order (text without the header and trailing blank lines)."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").split("\n")
    current = None
    body: list[str] = []
    for n, line in enumerate(lines, start=1):
        m = HEADER.match(line.strip())
        if m:
            if current is not None:
                blocks.append(Block(*current, "\n".join(body).strip("\n"), current_todo, current_line))
            current, current_todo, current_line, body = (m["id"], m["sha"]), bool(m["todo"]), n, []
        elif current is not None:
            body.append(line)
        elif line.strip():
            raise ValueError(f"{path.name}:{n}: text before the first '<!-- cell ID en:SHA -->' header")
    if current is not None:
        blocks.append(Block(*current, "\n".join(body).strip("\n"), current_todo, current_line))
    return blocks


def problems(en_path: Path) -> list[str]:
    """What keeps the Chinese twin of ``en_path`` from being built: missing, stale, unfinished or
    orphaned translation blocks (empty when it can be built)."""
    src = source_path(en_path)
    rel = src.relative_to(REPO_DIR)
    if not src.exists():
        return [f"{rel}: missing (python -m lessonkit.edition skeleton {en_path.stem[:2]} makes one to fill in)"]
    nb = json.loads(en_path.read_text(encoding="utf-8"))
    english = {c["id"]: cell_text(c) for c in nb["cells"] if c["cell_type"] == "markdown"}
    out = []
    try:
        blocks = read_blocks(src)
    except ValueError as e:
        return [str(e)]
    seen = set()
    for b in blocks:
        where = f"{rel}:{b.line} (cell {b.cell_id})"
        if b.cell_id in seen:
            out.append(f"{where}: a second block for the same cell")
        seen.add(b.cell_id)
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
        if cid not in seen:
            out.append(f"{rel}: no block for English cell {cid} (en:{en_sha(english[cid])}):\n"
                       + "\n".join("    | " + ln for ln in english[cid].split("\n")))
    return out


# What the Chinese share of a text leaves out: fenced code, inline code, formulas, link targets, HTML tags
_NOT_PROSE = [re.compile(r"```.*?```", re.S), re.compile(r"`[^`\n]*`"), re.compile(r"\$\$.*?\$\$", re.S),
              re.compile(r"\$[^$\n]+\$"), re.compile(r"\]\([^)]*\)"), re.compile(r"https?://\S+"),
              re.compile(r"<[^>\n]+>")]
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_CJK_PUNCT = re.compile(r"[\u3000-\u303f\uff00-\uffef]")
_LATIN = re.compile(r"[A-Za-z]")
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


def skeleton(en_path: Path) -> Path:
    """Write a translation file for ``en_path`` with the English text in TODO blocks (never over an
    existing file)."""
    src = source_path(en_path)
    if src.exists():
        raise FileExistsError(f"{src.relative_to(REPO_DIR)} exists; edit it")
    nb = json.loads(en_path.read_text(encoding="utf-8"))
    parts = []
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            t = cell_text(c)
            parts.append(f"<!-- cell {c['id']} en:{en_sha(t)} TODO -->\n{t}\n")
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text("\n".join(parts), encoding="utf-8")
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
    nb = json.loads(en_path.read_text(encoding="utf-8"))
    zh = {b.cell_id: b for b in read_blocks(source_path(en_path))}
    old_outputs = {}
    target = zh_path(en_path)
    if target.exists():
        for c in json.loads(target.read_text(encoding="utf-8"))["cells"]:
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
            c["outputs"], c["execution_count"] = old_outputs.get((c["id"], cell_text(c)), ([], None))
        cells.append(c)
    nb["cells"] = cells
    target.parent.mkdir(parents=True, exist_ok=True)
    # as nbformat writes it (sorted keys), so that a build after a run changes only what changed
    target.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
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
    path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")


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
    ap = argparse.ArgumentParser(prog="python -m lessonkit.edition", description=__doc__.split("\n\n")[0])
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
