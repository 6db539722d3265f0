"""``python -m workbench handouts``: one A4 PDF per lesson and edition, printed from the built site
(make handouts, after make site): _site/handouts/en/00_start_here.pdf, .../zh/00_start_here.pdf, ...

Headless Chromium prints each lesson's page of the site, driven by Playwright, with the site's print
stylesheet (workbench/site_conf/_static/print.css: no sidebars, code wrapped, plots and tables
whole). The Chromium is the system's (Debian: chromium or chromium-headless-shell; macOS: Google
Chrome), not Playwright's own build, whose download needs a host that a classroom may not reach.
Pages are opened from disk, and every request for anything but a local file is refused and named.
"""
from __future__ import annotations

import argparse
import html
import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

from . import site

# The system's Chromium, first found: the headless shell is the smallest; CHROMIUM=path overrides
CHROMIUM_NAMES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_PATHS = ("/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
                  "/Applications/Chromium.app/Contents/MacOS/Chromium")
# Chromium's own traffic (updates, sync, field trials, QUIC probes) off: on a machine without network
# its connections fail slowly and noisily, and a handout needs none of them. --no-sandbox: as root
# (a container, CI) Chromium refuses to start with its sandbox. Playwright gives every launch a fresh
# temporary profile (--user-data-dir) of its own.
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions"]
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
# The footer of every sheet: the page's title (the lesson's) and the page number
FOOTER = ('<div style="font-family: sans-serif; font-size: 7pt; color: #555; width: 100%; margin: 0 12mm; '
          'display: flex; justify-content: space-between;"><span class="title"></span>'
          '<span><span class="pageNumber"></span> / <span class="totalPages"></span></span></div>')
MARGIN = {"top": "12mm", "bottom": "14mm", "left": "12mm", "right": "12mm"}
# Wait for what a print would otherwise miss: MathJax's typesetting, the web fonts, and every image
# (a lazy one below the screen may not have been asked for yet)
SETTLE = """async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  await document.fonts.ready;
  for (const img of Array.from(document.images)) {
    img.loading = "eager";
    if (!img.complete) await new Promise(done => { img.onload = img.onerror = done; });
  }
}"""


def find_chromium() -> str | None:
    """The path of the system's Chromium (CHROMIUM=path first), or None."""
    if os.environ.get("CHROMIUM"):  # a name on PATH or a path; None when it is neither
        return shutil.which(os.environ["CHROMIUM"])
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return next((p for p in CHROMIUM_PATHS if os.path.exists(p)), None)


def missing_requirements() -> list[str]:
    """What printing lacks here, each with how to get it (empty: all there)."""
    missing = []
    if importlib.util.find_spec("playwright") is None:
        missing.append(f"the playwright package ({site.INSTALL_HINT})")
    if os.environ.get("CHROMIUM") and find_chromium() is None:
        missing.append(f"Chromium: CHROMIUM={os.environ['CHROMIUM']} is not a program here")
    elif find_chromium() is None:
        missing.append("Chromium (Debian: apt install chromium-headless-shell or chromium; macOS: Google Chrome; "
                       "or CHROMIUM=/path/to/it)")
    return missing


def launch(playwright):
    """The system's Chromium, headless, with LAUNCH_ARGS."""
    return playwright.chromium.launch(executable_path=find_chromium(), headless=True, args=LAUNCH_ARGS)


def refuse_remote(context, refused: list[str]) -> None:
    """Every request of the context's pages for anything but a local file is aborted and kept in
    ``refused``: a page that reaches out would print differently without the network."""
    def route(r):
        if r.request.url.startswith(LOCAL_SCHEMES):
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort()
    context.route("**/*", route)


def print_all(site_dir: Path, out: Path, editions=site.EDITIONS, lessons=None, echo=print) -> list[Path]:
    """Print each lesson's page of each edition to out/<edition>/<lesson>.pdf. Raises RuntimeError
    when a page is missing or asked for anything but a local file."""
    from playwright.sync_api import sync_playwright

    site_dir, out = Path(site_dir).resolve(), Path(out).resolve()
    names = lessons or site.lessons()
    pages = [(e, n, site_dir / e / f"{n}.html") for e in editions for n in names]  # (edition, lesson, page)
    absent = [str(p) for unused, unused2, p in pages if not p.is_file()]
    if absent:
        raise RuntimeError(f"no page {absent[0]}{' and others' if len(absent) > 1 else ''}: make site builds the site first")
    refused: list[str] = []
    written = []
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            context = browser.new_context()
            refuse_remote(context, refused)
            page = context.new_page()
            page.emulate_media(media="print")  # laid out for paper once, not for the screen first
            for edition, name, page_file in pages:
                pdf = out / edition / f"{name}.pdf"
                pdf.parent.mkdir(parents=True, exist_ok=True)
                page.goto(page_file.as_uri(), wait_until="load")
                page.evaluate(SETTLE)
                page.pdf(path=str(pdf), format="A4", print_background=True, margin=MARGIN,
                         display_header_footer=True, header_template="<span></span>", footer_template=FOOTER)
                written.append(pdf)
                echo(f"{edition}/{name}.pdf")
        finally:
            browser.close()
    if refused:
        raise RuntimeError("the pages asked for what is not on this machine: " + ", ".join(sorted(set(refused))))
    write_index(out)
    if out.parent == site_dir:
        site.write_chooser(site_dir)
    return written


INDEX = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Handouts · 讲义</title>
<style>body {{ font-family: system-ui, sans-serif; max-width: 48rem; margin: 2rem auto; padding: 0 1rem; }}
.editions {{ display: flex; gap: 3rem; }}</style></head>
<body><h1>Handouts · <span lang="zh-CN">讲义</span></h1><div class="editions">
{editions}</div></body></html>
"""


def write_index(out: Path) -> None:
    """out/index.html: every handout in out/, by edition, with its lesson's title."""
    editions = []
    for edition, heading in (("en", "English"), ("zh", "中文")):
        pdfs = sorted((out / edition).glob("*.pdf"))
        if pdfs:
            lang = "zh-CN" if edition == "zh" else "en"
            items = "".join(f'<li><a href="{edition}/{p.name}">{html.escape(site.lesson_title(edition, p.stem))}</a></li>'
                            for p in pdfs)
            editions.append(f'<section lang="{lang}"><h2>{heading}</h2><ul>{items}</ul></section>\n')
    (out / "index.html").write_text(INDEX.format(editions="".join(editions)), encoding="utf-8")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench handouts", description=__doc__.split("\n\n")[0].replace("``", ""))
    parser.add_argument("--site", type=Path, default=site.DEFAULT_OUT, help="the built site (default: _site)")
    parser.add_argument("--out", type=Path, help="where the PDFs go (default: SITE/handouts)")
    parser.add_argument("--edition", choices=site.EDITIONS, action="append", help="this edition only (repeatable)")
    parser.add_argument("--lesson", action="append", help="this lesson only, e.g. 02_online_softmax (repeatable)")
    args = parser.parse_args(argv)
    missing = missing_requirements()
    if missing:
        print("make handouts needs " + "; ".join(missing), file=sys.stderr)
        return 2
    out = args.out or args.site / "handouts"
    start = time.monotonic()
    try:
        written = print_all(args.site, out, tuple(args.edition or site.EDITIONS), args.lesson, echo=lambda s: None)
    except RuntimeError as err:
        print(f"FAILED handouts: {err}", file=sys.stderr)
        return 1
    print(f"{len(written)} handouts in {Path(out).resolve()} ({time.monotonic() - start:.1f} s)")
    return 0
