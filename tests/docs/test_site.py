"""The documentation site builds with ``mkdocs build --strict`` and its pages render in headless Chromium.

The build needs the ``docs`` extra (skipped without mkdocs); the rendering needs Chromium (Debian's ``chromium``
package; skipped without it). The front page and the ``attention`` API page are loaded as a browser would, after the
theme's JavaScript: each must show its title and the navigation and no error text, and a screenshot of each is saved
in the test's temporary folder (its path is logged). ``CENTROID_DOCS_SITE`` names a folder where the same
``mkdocs build --strict`` has just written the site (CI builds it in a stage of its own before the tests).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

from engine.testing import REPO, tool_env

_logger = logging.getLogger(__name__)
# Chromium starts a handful of processes per page; the site is built once, for the build test and the pages alike
pytestmark = pytest.mark.serial

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
# what a page must not show: a Python error, mkdocstrings' failure to load a module, the 404 page (the API pages
# name exceptions such as ImportError in their text, so only the front page is also checked for a bare "Error")
ERRORS = [r"Traceback \(most recent call last\)", r"ModuleNotFoundError", r"Could not collect", r"404 - Not found"]
FRONT_PAGE_ERRORS = [r"\bError\b", r"\bexception\b"]
NAV = ["Getting started", "Guides", "Benchmarks", "API reference"]
# a docstring's Sphinx role as text: docs/hooks.py turns the roles it sees into code, and one it cannot reach (in a
# literal block, or split from its code span) reaches the page as written
ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj|const):(?=\S)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prebuilt = os.environ.get("CENTROID_DOCS_SITE")
    if prebuilt:  # the same strict build of this checkout, made just before (CI's mkdocs stage): not built twice
        assert (Path(prebuilt) / "index.html").is_file(), f"CENTROID_DOCS_SITE={prebuilt} holds no built site"
        return Path(prebuilt)
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e .[docs]")
    out = tmp_path_factory.mktemp("site")
    env = {**tool_env(), "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"), "-d", str(out)]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-4000:]}"
    return out


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           f"--user-data-dir={profile}", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(profile)})


def _visible_text(dom: str) -> str:
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return unescape(re.sub(r"<[^>]+>", " ", dom))


@pytest.mark.slow
def test_site_builds_strictly(site: Path) -> None:
    for page in ("index.html", "benchmarks/index.html", "api/attention/index.html", "api/engine/index.html"):
        assert (site / page).is_file(), page


@pytest.mark.slow
def test_no_page_shows_a_sphinx_role(site: Path) -> None:
    shown = []
    for page in sorted(site.rglob("*.html")):
        text = _visible_text(page.read_text(encoding="utf-8"))
        for m in ROLE.finditer(text):
            around = " ".join(text[max(0, m.start() - 60) : m.end() + 60].split())
            shown.append(f"{page.relative_to(site)}: ...{around}...")
    assert not shown, "pages show raw roles (write plain text in a docstring's literal block):\n" + "\n".join(shown)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install -y chromium)")
@pytest.mark.parametrize(
    ("page", "title", "must_show"),
    [
        ("index.html", "Centroid toolkit", []),
        ("api/attention/index.html", "attention - Centroid toolkit", ["CentroidAttention", "farthest_point_sample"]),
    ],
)
def test_page_renders_in_chromium(site: Path, tmp_path: Path, page: str, title: str, must_show: list[str]) -> None:
    url = (site / page).as_uri()
    dumped = _chromium("--dump-dom", url, profile=tmp_path / "profile")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = dumped.stdout
    found = re.search(r"<title>(.*?)</title>", dom, re.S)
    assert found and unescape(found.group(1)).strip() == title
    assert 'class="md-nav' in dom, "no navigation in the rendered page"
    text = _visible_text(dom)
    for label in [*NAV, *must_show]:
        assert label in text, f"{page} does not show {label!r}"
    for pattern in ERRORS + (FRONT_PAGE_ERRORS if page == "index.html" else []):
        assert not re.search(pattern, text), f"{page} shows {pattern!r}"
    shot = tmp_path / (page.replace("/", "_").removesuffix(".html") + ".png")
    done = _chromium(f"--screenshot={shot}", "--window-size=1280,1600", "--hide-scrollbars", url,
                     profile=tmp_path / "profile")  # fmt: skip
    assert done.returncode == 0 and shot.is_file() and shot.stat().st_size > 10_000, done.stderr[-2000:]
    _logger.warning("screenshot of %s: %s", page, shot)
