"""A look at what a student sees: log in to a running class hub in headless Chromium, change the
first password, let the server start, and take a screenshot of JupyterLab on the landing lesson.
It prints the menu bar's labels and whether the lesson's outputs are on screen, so that "the
menus are Chinese and lesson 00 shows its outputs" is checked, not only pictured.

    sudo make class-demo &          # or any running hub
    python class/tests/screenshot.py http://127.0.0.1:8000 ming demo-ming-pw shot.png

Needs Debian's chromium and playwright from PyPI (pip install playwright; no browser download:
it drives /usr/bin/chromium). Not part of make test: the test machines have no browser.
"""
import sys

from playwright.sync_api import sync_playwright


def main(base: str, user: str, first: str, out: str) -> int:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(f"{base}/hub/login")
        page.fill("input[name=username]", user)
        page.fill("input[name=password]", first)
        page.click("input[type=submit], button[type=submit]")
        if "change-password" in page.url:  # the first login
            new = f"{user}-Own-Pass-2026!"
            page.fill("input[name=old_password]", first)
            page.fill("input[name=new_password]", new)
            page.fill("input[name=new_password_confirmation]", new)
            page.click("input[type=submit], button[type=submit]")
        page.goto(f"{base}/hub/spawn")
        page.wait_for_url("**/lab/**", timeout=120_000)
        page.wait_for_selector(".jp-Notebook .jp-OutputArea-output", timeout=120_000)
        page.wait_for_timeout(3000)  # fonts and the figure
        menus = page.locator("#jp-menu-panel .lm-MenuBar-itemLabel").all_inner_texts()
        outputs = page.locator(".jp-Notebook .jp-OutputArea-output").count()
        page.screenshot(path=out)
        figure = page.locator(".jp-Notebook .jp-RenderedImage img").first
        figure.scroll_into_view_if_needed()
        page.wait_for_timeout(1000)
        second = out.replace(".png", "-figure.png")
        page.screenshot(path=second)
        print(f"url: {page.url}\nmenu bar: {' | '.join(menus)}\noutputs on the page: {outputs}\n"
              f"screenshots: {out}, {second} (scrolled to the first figure)")
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
