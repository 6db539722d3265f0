"""``python -m workbench site``: the lessons as two static websites, English and Chinese (make site).

Each edition is built by Sphinx with MyST-NB and the book theme (configuration: workbench/site_conf/)
from the committed notebooks, outputs and all (nothing is run), with the glossary and the references:
_site/en/ from notebooks/, _site/zh/ from notebooks/zh/, and _site/index.html to choose. Every
warning is an error. The pages load nothing from another host (MathJax included), so the folder can
be opened from disk or served from any machine, with or without a network.

Its pages sit at each site's top (_site/en/00_start_here.html, .../glossary.html, .../references.html):
the sources are staged first in a folder of their own, and workbook_site points the lessons' links,
written for the repository's layout, at those pages.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import posixpath
import re
import shutil
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONF_DIR = Path(__file__).resolve().parent / "site_conf"
DEFAULT_OUT = REPO / "_site"
EDITIONS = ("en", "zh")
# Where each edition's lessons are in the repository
LESSON_DIRS = {"en": "notebooks", "zh": "notebooks/zh"}
# Pages that both sites show, each from one file: page name -> repository path
SHARED_PAGES = {"glossary": "notebooks/glossary.md", "references": "docs/references.md"}
# What each edition's Sphinx is told beyond conf.py
SPHINX_ARGS = {"en": ["-t", "en"], "zh": ["-t", "zh", "-D", "language=zh_CN"]}
# The Python packages the build needs (the site extra of pyproject.toml): module -> distribution
REQUIRED = {"sphinx": "sphinx", "myst_nb": "myst-nb", "sphinx_book_theme": "sphinx-book-theme",
            "mathjax": "django-static-mathjax"}
INSTALL_HINT = "make site installs them into .venv (pip install -e '.[site]')"


def lessons(edition: str = "en") -> list[str]:
    """The lessons' page names (00_start_here, ...), from the notebooks of that edition."""
    return sorted(p.stem for p in (REPO / LESSON_DIRS[edition]).glob("[0-9][0-9]*.ipynb"))


def lesson_title(edition: str, name: str) -> str:
    """The lesson's title, its notebook's first heading, without markdown's marks."""
    nb = json.loads((REPO / LESSON_DIRS[edition] / f"{name}.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            m = re.search(r"^# (.+)$", "".join(cell["source"]), re.M)
            if m:
                return re.sub(r"[`*]", "", m.group(1)).strip()
    return name


def repo_path(edition: str, docname: str) -> str | None:
    """The repository file a page of that edition is made from; None for its first page, which
    site_conf/index.<edition>.md makes (its links name the site's pages)."""
    if docname == "index":
        return None
    if docname in SHARED_PAGES:
        return SHARED_PAGES[docname]
    return f"{LESSON_DIRS[edition]}/{docname}.ipynb"


def page_of(path: str, edition: str) -> tuple[str, str] | None:
    """(edition, page name) of a repository path that a page of ``edition`` links to: a shared page in
    that same edition, a lesson in the edition whose folder holds it; None for any other file."""
    for name, shared in SHARED_PAGES.items():
        if path == shared:
            return edition, name
    folder, name = posixpath.split(path)
    for lesson_edition, lesson_dir in LESSON_DIRS.items():
        if folder == lesson_dir and name.endswith(".ipynb"):
            return lesson_edition, name[: -len(".ipynb")]
    return None


def mathjax_dir() -> Path:
    """MathJax 3's browser build (es5/) from the django-static-mathjax package, a plain copy of
    MathJax's release files on PyPI: pip brings it wherever it brings Sphinx, no npm or CDN needed."""
    return Path(str(resources.files("mathjax"))) / "static" / "mathjax" / "es5"


def missing_requirements() -> list[str]:
    """The distributions of the site extra that this Python lacks."""
    if sys.version_info < (3, 11):
        return [f"Python 3.11 or newer for Sphinx 9 (this is {sys.version.split()[0]})"]
    missing = [dist for module, dist in REQUIRED.items() if importlib.util.find_spec(module) is None]
    if "django-static-mathjax" not in missing and not (mathjax_dir() / "tex-chtml.js").is_file():
        missing.append("django-static-mathjax")
    return missing


def stage(edition: str, src: Path) -> None:
    """The edition's pages in ``src``, every one at the top: copies of its lessons, the glossary, the
    references, and its first page (site_conf/index.<edition>.md, with the lessons listed)."""
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    names = lessons(edition)
    for name in names:
        shutil.copy2(REPO / LESSON_DIRS[edition] / f"{name}.ipynb", src / f"{name}.ipynb")
    for name, path in SHARED_PAGES.items():
        shutil.copy2(REPO / path, src / f"{name}{Path(path).suffix}")
    index = (CONF_DIR / f"index.{edition}.md").read_text(encoding="utf-8")
    links = "\n".join(f"- [](./{name}.ipynb)" for name in names)  # an empty text: MyST puts the title
    (src / "index.md").write_text(index.replace("{lesson_links}", links).replace("{lessons}", "\n".join(names)),
                                  encoding="utf-8")


def check_editions() -> list[str]:
    """Every English lesson has its Chinese twin and the other way round (each page links to it)."""
    en, zh = set(lessons("en")), set(lessons("zh"))
    return [f"{LESSON_DIRS['zh']}/{n}.ipynb missing (the twin of {LESSON_DIRS['en']}/{n}.ipynb)" for n in sorted(en - zh)] + \
           [f"{LESSON_DIRS['en']}/{n}.ipynb missing (the twin of {LESSON_DIRS['zh']}/{n}.ipynb)" for n in sorted(zh - en)]


def sphinx_command(edition: str, work: Path) -> list[str]:
    # Into work/html, not straight into out/<edition>: MyST-NB writes its notebooks' images beside the
    # output folder (its parent's jupyter_execute/), which the two editions, built at once, would share.
    # -E -a: a fresh build every time: an environment kept from an earlier build would not read again
    # (and so not warn again about) a page that failed it. -W --keep-going: every warning, then fail.
    return [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-E", "-a", "-W", "--keep-going",
            "-c", str(CONF_DIR), "-d", str(work / "doctrees"), *SPHINX_ARGS[edition],
            str(work / "src"), str(work / "html")]


# _site/index.html: the two editions, and the handouts once make handouts has printed them
CHOOSER = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>flash_attn_single_q_q8_neon · workbook · 练习册</title>
<style>body {{ font-family: system-ui, sans-serif; max-width: 40rem; margin: 3rem auto; padding: 0 1rem; line-height: 1.5; }}
a {{ font-size: 1.25rem; }}</style></head>
<body><h1>flash_attn_single_q_q8_neon</h1>
<p>The workbook of article 9-2 · 第 9-2 篇的配套练习册</p>
<ul>
<li><a href="en/index.html" hreflang="en">English</a></li>
<li lang="zh-CN"><a href="zh/index.html" hreflang="zh-CN">中文</a></li>
</ul>
{handouts}</body></html>
"""
HANDOUTS_LINK = """<p><a href="handouts/index.html">Handouts</a>: one A4 PDF per lesson · <span lang="zh-CN">讲义：每课一份 A4 PDF</span></p>
"""


def write_chooser(out: Path) -> None:
    """out/index.html, which links to the handouts where make handouts has printed them."""
    handouts = HANDOUTS_LINK if (out / "handouts" / "index.html").is_file() else ""
    (out / "index.html").write_text(CHOOSER.format(handouts=handouts), encoding="utf-8")


def build(out: Path = DEFAULT_OUT, editions=EDITIONS, echo=print) -> dict[str, float]:
    """Build the editions into out/<edition>/ (both at once, one Sphinx process each) and write
    out/index.html. Returns each edition's seconds; raises RuntimeError with Sphinx's messages."""
    problems = check_editions()
    if problems:
        raise RuntimeError("the two editions differ:\n  " + "\n  ".join(problems))
    out = Path(out).resolve()
    runs = {}
    for edition in editions:
        work = out / ".build" / edition
        shutil.rmtree(work, ignore_errors=True)
        stage(edition, work / "src")
        runs[edition] = (time.monotonic(), subprocess.Popen(
            sphinx_command(edition, work), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, cwd=REPO))
    seconds, failed = {}, []
    for edition, (start, proc) in runs.items():
        output, unused = proc.communicate()
        seconds[edition] = time.monotonic() - start
        for line in output.splitlines():
            echo(f"[{edition}] {line}")
        if proc.returncode != 0:
            failed.append(edition)
    if failed:
        raise RuntimeError(f"the {' and '.join(failed)} site failed to build (messages above)")
    for edition in editions:
        shutil.rmtree(out / edition, ignore_errors=True)
        (out / ".build" / edition / "html").rename(out / edition)
    shutil.rmtree(out / ".build", ignore_errors=True)
    write_chooser(out)
    return seconds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench site", description=__doc__.split("\n\n")[0].replace("``", ""))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the sites go (default: _site)")
    parser.add_argument("--edition", choices=EDITIONS, action="append",
                        help="build this edition only (repeatable; default: both)")
    args = parser.parse_args(argv)
    missing = missing_requirements()
    if missing:
        print(f"make site needs {', '.join(missing)}: {INSTALL_HINT}", file=sys.stderr)
        return 2
    try:
        seconds = build(args.out, tuple(args.edition or EDITIONS))
    except RuntimeError as err:
        print(f"FAILED site: {err}", file=sys.stderr)
        return 1
    out = Path(args.out).resolve()
    for edition, s in seconds.items():
        print(f"{edition}: {out / edition / 'index.html'} ({s:.1f} s)")
    print(f"open {out / 'index.html'}")
    return 0
