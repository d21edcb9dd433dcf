"""The page `builder status --html` writes, opened in a real headless browser (Debian's chromium through
its chromedriver, both from scripts/setup-host; nothing is downloaded): the DOM shows the rows and their
states, a failing check by name, a regression's verdict, the plots' points where their figures put
them; nothing is loaded from anywhere; it reads on a phone's width and prints."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from builder.config import reference_figures
from builder.config.matrix import load_matrix
from builder.lock import store
from checkouts import REPO
from status_projects import (FAILED_CHECK, ODD_CHECK, PASSING, REGRESSION, REJECTED_CHECK, REJECTED_STACK, STACK,
                             expected_state, regression_project, run_offline)


CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# This host's network is closed, and a test page must load nothing: no background fetches either.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")
DESKTOP, PHONE = (1280, 1000), (390, 844)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    for path in (CHROMIUM, CHROMEDRIVER):
        assert os.access(path, os.X_OK), f"{path} is missing: scripts/setup-host installs chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.add_argument(f"--window-size={DESKTOP[0]},{DESKTOP[1]}")
    # The driver named by path: selenium's own manager would look for one to download.
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


def _page(root: Path, site: Path, tmp_path: Path) -> Path:
    env = {k: v for k, v in os.environ.items() if k not in ("BUILDER_LOCK",)}
    env["BUILDER_CACHE"] = str(tmp_path / "cache")
    result = run_offline("status", "--matrix", str(root / "matrix.toml"), "--html", str(site), cwd=root, env=env)
    assert result.returncode == 0, result.stderr
    return site / "index.html"


def _open(browser, page: Path, size=DESKTOP):
    browser.set_window_size(*size)
    browser.get(page.as_uri())
    return browser


def _row(browser, stack: str):
    return browser.find_element(By.CSS_SELECTOR, f'table.rows tr[data-stack="{stack}"]')


def _nothing_loaded(browser) -> None:
    """No script, and nothing fetched: the document is the only resource the browser asked for."""
    assert browser.find_elements(By.TAG_NAME, "script") == []
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    for attribute in ("src", "href"):
        assert browser.execute_script(f"return [...document.querySelectorAll('[{attribute}]')].length") == 0


@pytest.fixture(scope="module")
def committed_page(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("committed")
    return _page(REPO, tmp_path / "site", tmp_path)


@pytest.fixture(scope="module")
def regression_page(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("regression")
    root = regression_project(tmp_path / "project")
    return _page(root, tmp_path / "site", tmp_path), root


def test_the_committed_lock_shows_every_row_and_its_state(browser, committed_page, tmp_path):
    _open(browser, committed_page)
    matrix = load_matrix(REPO / "matrix.toml")
    lock = store.read(REPO / "matrix.lock")
    rows = browser.find_elements(By.CSS_SELECTOR, "table.rows tbody tr")
    assert [r.get_attribute("data-stack") for r in rows] == [row.name for row in matrix.all_rows()]
    for row in matrix.all_rows():
        entry = lock.get(row.name)
        shown = _row(browser, row.name).find_element(By.CSS_SELECTOR, ".state")
        assert shown.is_displayed()
        assert shown.text == expected_state(entry)
        image = entry.outcome.image if entry else None
        if image:
            assert _row(browser, row.name).find_element(By.CSS_SELECTOR, "dl.image").text.count(image.immutable_tag) == 1
    _nothing_loaded(browser)
    assert browser.title == "Stack status"
    assert browser.save_screenshot(str(tmp_path / "committed.png"))


def test_each_plot_labels_the_reference_figures_with_their_row_and_note(browser, committed_page):
    _open(browser, committed_page)
    matrix = load_matrix(REPO / "matrix.toml")
    figures = reference_figures.load(REPO / "bench" / "reference.toml")
    cu130 = matrix.stack("sglang-0.5.9-cu130")
    plot = browser.find_element(By.CSS_SELECTOR, 'figure.bench[data-stack="sglang-0.5.9-cu130"]')
    expected = [f for name in (cu130.name, cu130.replaces) for f in figures[name]]
    drawn = plot.find_elements(By.CSS_SELECTOR, "svg g.reference")
    assert sorted(float(g.get_attribute("data-tok-s")) for g in drawn) == sorted(f["tok_s"] for f in expected)
    assert {83.9, 89.5, 96.1, 54.1} <= {f["tok_s"] for f in expected}
    listed = plot.find_elements(By.CSS_SELECTOR, "ol.references li")
    for figure in expected:
        (item,) = [li for li in listed if float(li.get_attribute("data-tok-s")) == figure["tok_s"]]
        assert figure["stack"] in item.text and (figure.get("note") or "not recorded") in item.text
        assert item.get_attribute("data-stack") == figure["stack"]
    svg = plot.find_element(By.TAG_NAME, "svg")
    assert svg.get_attribute("role") == "img"
    title_id, desc_id = svg.get_attribute("aria-labelledby").split()
    assert "89.5" in browser.find_element(By.ID, desc_id).get_attribute("textContent")
    assert "sglang-0.5.9-cu130" in browser.find_element(By.ID, title_id).get_attribute("textContent")
    # Higher figures are drawn higher.
    heights = {float(g.get_attribute("data-tok-s")): g.find_element(By.TAG_NAME, "line").rect["y"] for g in drawn}
    assert [tok for tok, _ in sorted(heights.items(), key=lambda item: item[1])] == sorted(heights, reverse=True)


def test_each_image_has_a_bar_per_layer_sized_by_its_bytes(browser, committed_page):
    _open(browser, committed_page)
    lock = store.read(REPO / "matrix.lock")
    built = [(name, e.outcome.image) for name, e in lock.stacks.items() if e.outcome.image]
    for name, image in built:
        figure = browser.find_element(By.CSS_SELECTOR, f'figure.layers[data-stack="{name}"]')
        report = REPO / image.report
        if not report.exists():
            assert "No layer sizes" in figure.text
            continue
        layers = json.loads(report.read_text())["layers"]
        bars = figure.find_elements(By.CSS_SELECTOR, "svg g.layer")
        assert [int(b.get_attribute("data-bytes")) for b in bars] == [layer["bytes"] for layer in layers]
        widths = [b.find_element(By.TAG_NAME, "rect").rect["width"] for b in bars]
        largest = max(range(len(layers)), key=lambda i: layers[i]["bytes"])
        assert widths.index(max(widths)) == largest
        assert figure.get_attribute("data-total-bytes") == str(sum(layer["bytes"] for layer in layers))


def test_a_failing_check_and_a_regression_show_in_the_dom(browser, regression_page, tmp_path):
    page, root = regression_page
    _open(browser, page)
    row = _row(browser, STACK)
    assert row.get_attribute("data-state") == "built" and row.find_element(By.CSS_SELECTOR, ".state").text == "built"
    failed = row.find_elements(By.CSS_SELECTOR, "td.smoke .failed-check")
    assert [f.get_attribute("data-check") for f in failed] == [FAILED_CHECK, ODD_CHECK]
    assert [f.text for f in failed] == [FAILED_CHECK, ODD_CHECK] and all(f.is_displayed() for f in failed)
    assert row.find_elements(By.CSS_SELECTOR, "td.smoke b") == []  # a check's name is text, never markup
    baseline = row.find_element(By.CSS_SELECTOR, 'td.bench li[data-mode="baseline"]')
    assert baseline.get_attribute("data-verdict") == "regression"
    verdict = baseline.find_element(By.CSS_SELECTOR, ".verdict")
    assert verdict.text.endswith("regression") and verdict.is_displayed()
    assert "80.0 / 89.5 tok/s -10.6% ±3%" in baseline.text
    assert row.find_element(By.CSS_SELECTOR, 'td.bench li[data-mode="eagle3"]').get_attribute("data-verdict") == "pass"
    rejected = _row(browser, REJECTED_STACK)
    assert rejected.get_attribute("data-state") == "rejected"
    assert rejected.find_element(By.CSS_SELECTOR, ".rejected .failed-check").text == REJECTED_CHECK
    _nothing_loaded(browser)
    browser.save_screenshot(str(tmp_path / "regression.png"))
    assert (tmp_path / "regression.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_puts_each_figure_of_the_history_where_its_value_is(browser, regression_page):
    page, _ = regression_page
    _open(browser, page)
    plot = browser.find_element(By.CSS_SELECTOR, f'figure.bench[data-stack="{STACK}"]')
    points = plot.find_elements(By.CSS_SELECTOR, 'svg g.point[data-mode="baseline"]')
    assert [(float(p.get_attribute("data-tok-s")), p.get_attribute("data-verdict")) for p in points] == [
        (PASSING["tok_s"], "pass"), (REGRESSION["tok_s"], "regression")]
    passing, regressed = (p.find_elements(By.TAG_NAME, "circle")[-1].rect for p in points)
    assert regressed["x"] > passing["x"]  # later
    assert regressed["y"] > passing["y"]  # lower
    reference = plot.find_element(By.CSS_SELECTOR, 'g.reference[data-mode="baseline"] line').rect
    assert passing["y"] < reference["y"] + 6 < regressed["y"]  # 88.9 at the 89.5 line, 80.0 well under it
    assert len(points[1].find_elements(By.CSS_SELECTOR, "circle.regression-ring")) == 1
    assert points[0].find_elements(By.CSS_SELECTOR, "circle.regression-ring") == []
    desc_id = plot.find_element(By.TAG_NAME, "svg").get_attribute("aria-labelledby").split()[1]
    assert "baseline: 80.0 tok/s, regression" in browser.find_element(By.ID, desc_id).get_attribute("textContent")
    measured = plot.find_elements(By.CSS_SELECTOR, "table.figures tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[2].text for r in measured] == ["pass", "pass", "regression"]


def test_on_a_phone_each_row_is_a_card_and_nothing_scrolls_sideways(browser, regression_page, tmp_path):
    page, _ = regression_page
    _open(browser, page, PHONE)
    try:
        assert browser.execute_script("return document.documentElement.scrollWidth - "
                                      "document.documentElement.clientWidth") <= 0
        cell = _row(browser, STACK).find_element(By.CSS_SELECTOR, "td.smoke")
        assert browser.execute_script("return getComputedStyle(arguments[0]).display", cell) == "block"
        label = browser.execute_script("return getComputedStyle(arguments[0], '::before').content", cell)
        assert label == '"smoke: "'
        plot = browser.find_element(By.CSS_SELECTOR, f'figure.bench[data-stack="{STACK}"] svg')
        assert 0 < plot.rect["width"] <= PHONE[0]
        browser.save_screenshot(str(tmp_path / "phone.png"))
    finally:
        browser.set_window_size(*DESKTOP)


def test_it_prints(browser, regression_page):
    page, _ = regression_page
    _open(browser, page)
    pdf = base64.b64decode(browser.print_page())
    assert pdf.startswith(b"%PDF") and pdf.count(b"/Type /Page") >= 2
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
    try:
        wrap = browser.find_element(By.CSS_SELECTOR, ".table-wrap")
        assert browser.execute_script("return getComputedStyle(arguments[0]).overflowX", wrap) == "visible"
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": ""})

