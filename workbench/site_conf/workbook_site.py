"""The Sphinx extension of ``make site`` (conf.py beside it loads it): what the workbook's pages need
beyond Sphinx, MyST-NB and the book theme.

- The Chinese lessons' first cell, ``lessonkit.set_language("zh")``, is not shown: a page reads in one
  language already, and the cell means nothing outside a kernel. The notebooks stay as they are (the
  Chinese ones are generated from the English ones); the cell is tagged ``remove-cell`` while MyST-NB
  reads the file, so the downloaded notebook still has it.
- Links between lessons are written for the repository's layout (``../docs/references.md``,
  ``zh/00_start_here.ipynb#Anchor``, ``../01_quantize_q.ipynb``), and each edition is a site of its
  own with every page at its top. Each link is read back to the repository path it names, then pointed
  at the page of this edition that holds that file, or at the other edition's site beside this one.
  A link to another file of the workbook (native/...) keeps its text, without a link; a link to a
  file that does not exist is a warning, and so fails the build.
- Every page gets its twin in the other language and its source for download (the ``edition-links``
  template in the article's header).
- MathJax is served from the site itself (``_static/mathjax``): Sphinx's default loads it from a CDN.
- The Chinese site's search works (ChineseSearch).
"""
from __future__ import annotations

import ast
import posixpath
import shutil
from pathlib import Path

import nbformat
from docutils import nodes
from sphinx import addnodes
from sphinx.search.zh import SearchChinese
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging

from workbench import site

logger = logging.getLogger(__name__)

# What the header's links say, in the language of the page they are on
LABELS = {
    "en": {"twin": "中文版", "twin_title": "这一页的中文版", "notebook": "Download this notebook (.ipynb)",
           "page": "Download this page (.md)"},
    "zh": {"twin": "English", "twin_title": "This page in English", "notebook": "下载本课的 notebook（.ipynb）",
           "page": "下载本页（.md）"},
}


def jupyter_slug(title: str) -> str:
    """The anchor JupyterLab gives a heading (its text, spaces as hyphens), which the lessons' links
    use: ``00_start_here.ipynb#How-the-lessons-map-to-the-article``. MyST's default is GitHub's
    lower-case slug, under which those links would not resolve. (An import path in conf.py, as
    MyST asks: Sphinx pickles its configuration, and a function defined in conf.py cannot be.)"""
    return title.strip().replace(" ", "-")


def only_sets_language(source: str) -> bool:
    """True for a cell that does nothing but choose lessonkit's language: ``import lessonkit`` (or
    ``from lessonkit import set_language``) and ``set_language(...)`` calls, nothing else."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    names, calls = set(), 0
    for stmt in body:
        if isinstance(stmt, ast.Import) and all(a.name == "lessonkit" for a in stmt.names):
            names.update(a.asname or a.name for a in stmt.names)
        elif isinstance(stmt, ast.ImportFrom) and stmt.module == "lessonkit" and \
                all(a.name == "set_language" for a in stmt.names):
            names.update(a.asname or a.name for a in stmt.names)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            func = stmt.value.func
            if isinstance(func, ast.Attribute) and func.attr == "set_language" and \
                    isinstance(func.value, ast.Name) and func.value.id in names:
                calls += 1
            elif isinstance(func, ast.Name) and func.id in names and func.id != "lessonkit":
                calls += 1
            else:
                return False
        else:
            return False
    return calls > 0


def read_notebook(text: str) -> nbformat.NotebookNode:
    """MyST-NB's reader of .ipynb files (conf.py's nb_custom_formats), which tags the first code
    cell ``remove-cell`` when it only sets the language."""
    nb = nbformat.reads(text, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            if only_sets_language(cell.source):
                tags = cell.metadata.setdefault("tags", [])
                if "remove-cell" not in tags:
                    tags.append("remove-cell")
            break
    return nb


class EditionLinks(SphinxPostTransform):
    """Points each link to a lesson, the glossary or the references at the page that holds that file:
    in this edition, MyST's resolver then finds the page (and warns where it does not); in the other
    edition, a plain link to the other site. Before MyST's resolver (priority 9), which would
    otherwise report the repository paths as missing documents."""

    default_priority = 8

    def run(self, **kwargs) -> None:
        edition = self.config.workbook_edition
        source = site.repo_path(edition, self.env.docname)
        if source is None:
            return  # the first page: its links name the site's pages, which MyST finds as they are
        here = posixpath.dirname(source)
        for node in list(self.document.findall(addnodes.pending_xref)):
            if node.get("reftype") != "myst":
                continue
            if node.get("refdomain") == "doc":
                # MyST found a file of that name beside the page; in the staged source every page sits
                # at the top, so the link named that file as it is called there
                path = self.env.doc2path(node["reftarget"], False).as_posix()
                anchor = node.get("reftargetid")
            elif node.get("refdomain") is None:
                path, unused, anchor = node["reftarget"].partition("#")
                if not path:
                    continue  # not a link to a file: left to MyST
            else:
                continue
            target = posixpath.normpath(posixpath.join(here, path))
            page = site.page_of(target, edition)
            if page is None:
                if (site.REPO / target).exists():
                    # a file of the workbook that the site does not hold (the kernel's source, say):
                    # its name stays, as text; the reader has it in the workbook's folder
                    logger.info("link to %s: not on the site, shown as text", target, location=node)
                else:
                    logger.warning("link to %s (%s in the repository): no such file", path, target,
                                   location=node, type="workbook", subtype="link")
                node.replace_self(nodes.inline("", "", *node.children, classes=["workbook-file"]))
                continue
            target_edition, docname = page
            if target_edition == edition:
                node["refdomain"] = "doc"
                node["reftarget"] = docname
                node["reftargetid"] = anchor or None
                continue
            if not (site.REPO / target).is_file():
                logger.warning("link to %s: no such file in the repository", target, location=node,
                               type="workbook", subtype="link")
            uri = "../" * (self.env.docname.count("/") + 1) + f"{target_edition}/{docname}.html"
            if anchor:
                uri += "#" + anchor
            link = nodes.reference("", "", internal=False, refuri=uri, classes=["workbook-other-edition"])
            link += node.children
            node.replace_self(link)


def page_context(app, pagename, templatename, context, doctree) -> None:
    """The header's links (the edition-links template): the twin page in the other edition's site,
    at the same name, and this page's source (html_sourcelink_suffix is empty, so it is the file)."""
    edition = app.config.workbook_edition
    other = "zh" if edition == "en" else "en"
    context["workbook_twin_url"] = "../" * (pagename.count("/") + 1) + f"{other}/{pagename}.html"
    context["workbook_twin_lang"] = "zh-CN" if other == "zh" else "en"
    labels = LABELS[edition]
    context["workbook_twin_label"], context["workbook_twin_title"] = labels["twin"], labels["twin_title"]
    source = context.get("sourcename") or ""
    context["workbook_download"] = None
    if pagename != app.config.root_doc and source.endswith((".ipynb", ".md")):
        context["workbook_download"] = labels["notebook" if source.endswith(".ipynb") else "page"]
        context["workbook_download_name"] = posixpath.basename(source)


def copy_mathjax(app, exception) -> None:
    """MathJax 3 (the django-static-mathjax package's es5 build; any other with the same files would
    do) into _static/mathjax, so that no page loads it from a CDN. The CHTML output, its fonts, the
    TeX extensions it loads on demand and the menu's accessibility parts; not the other bundles."""
    if exception is not None or app.builder.format != "html":
        return
    dest = Path(app.outdir) / "_static" / "mathjax"
    shutil.rmtree(dest, ignore_errors=True)
    source = site.mathjax_dir()
    dest.mkdir(parents=True)
    shutil.copy2(source / "tex-chtml.js", dest / "tex-chtml.js")
    for part in ("input", "output/chtml", "ui", "a11y", "sre", "adaptors"):
        shutil.copytree(source / part, dest / part)


class ChineseSearch(SearchChinese):
    """Sphinx's Chinese search (jieba's words; Latin words by the English stemmer), with the name of
    its JavaScript stemmer right. Sphinx 9.0 names that stemmer after the language, ChineseStemmer,
    which its english-stemmer.js does not define, so every search of a Chinese site stops at
    "ChineseStemmer is not defined" (later Sphinx derives the name from the file). The language's
    name serves nothing else than that and a log line."""

    language_name = "English"


def setup(app):
    app.add_search_language(ChineseSearch)
    app.add_config_value("workbook_edition", "en", "env", types=frozenset({str}))
    app.add_post_transform(EditionLinks)
    app.connect("html-page-context", page_context)
    app.connect("build-finished", copy_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
