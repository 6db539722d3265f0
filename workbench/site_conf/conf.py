"""Sphinx configuration of the workbook's site, both editions (python -m workbench site runs it).

The English site is built from notebooks/ (with the glossary and the references), the Chinese one
with ``-t zh -D language=zh_CN`` from notebooks/zh/, whose notebooks hold Chinese text and outputs
already (not through Sphinx's gettext). workbench/site.py stages each edition's pages in a folder of
their own, every page at its top, and runs Sphinx on it with this folder as the configuration.
"""
import logging
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # workbook_site, the extension beside this file

# Not imported in this process: rfc3987-syntax (which JupyterLab's packages bring into .venv) compiles
# its grammars when it is imported, about 3 s, and jsonschema imports it, for nbformat, only to check
# IRI formats that no notebook schema asks for; jsonschema goes without it when it cannot be imported.
sys.modules.setdefault("rfc3987_syntax", None)

edition = "zh" if tags.has("zh") else "en"  # noqa: F821 (tags: given by Sphinx to conf.py)

project = ("flash_attn_single_q_q8_neon：第 9-2 篇的配套练习册" if edition == "zh"
           else "flash_attn_single_q_q8_neon: the workbook of article 9-2")
html_title = "文章 9-2 练习册" if edition == "zh" else "Article 9-2 workbook"
author = ""
copyright = ""
root_doc = "index"

extensions = ["myst_nb", "workbook_site"]
workbook_edition = edition

# Notebooks as they are committed, outputs and all: nothing runs while the site builds
nb_execution_mode = "off"
nb_merge_streams = True
# the lessons' .ipynb through workbook_site.read_notebook: the Chinese first cell (set_language) is hidden
nb_custom_formats = {".ipynb": ["workbook_site.read_notebook", {}, False]}

myst_enable_extensions = ["dollarmath"]
# Jupyter's anchors (the lessons link to #How-the-lessons-map-to-the-article); an import path, as a
# function here could not be pickled with the configuration
myst_heading_anchors = 6
myst_heading_slug_func = "workbook_site.jupyter_slug"

# The theme's own words (search, contents, previous, next) in the page's language; -D language=zh_CN
# for the Chinese site, which also gives its pages lang="zh-CN" and Chinese word breaks in its search
# (jieba, where installed; without it Sphinx splits Chinese text less well and says nothing)
language = "en"
if edition == "zh":
    # Sphinx's default "user dictionary" is jieba's own, which jieba reads anyway: read twice, it costs
    # seconds and changes no word break
    html_search_options = {"dict": ""}
    try:
        import jieba
        jieba.setLogLevel(logging.WARNING)  # not its "Building prefix dict" lines on every build
    except ImportError:
        pass

html_theme = "sphinx_book_theme"
html_theme_options = {
    "use_download_button": False,  # the edition-links template has an explicit one
    "use_fullscreen_button": False,
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "article_header_end": ["edition-links.html", "article-header-buttons.html"],
}
templates_path = ["_templates"]
html_static_path = ["_static"]
html_css_files = ["workbook.css", "print.css"]
html_show_copyright = False
html_show_sphinx = False
# the page's source is copied as it is (_sources/00_start_here.ipynb, not .ipynb.txt): the download link
html_copy_source = True
html_sourcelink_suffix = ""

# MathJax from the site itself: workbook_site copies it into _static/mathjax (the default is a CDN)
mathjax_path = "mathjax/tex-chtml.js"
