"""The replay reports as a reader sees them: opened in headless Chromium (Debian's
``chromium`` driven through Debian's ``chromium-driver`` by Selenium), offline, every plot
drawn, no console error, the headline card showing summary.json's numbers. Screenshots are
kept under ``$PLANNER_TEST_ARTIFACTS`` (else the test's tmp folder); the test prints where.

Outside CI a machine without chromium skips with the command to install it; in CI
(``CI=true``) a missing browser fails."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.replay.parallel import run_policies
from disagg_planner.replay.session import WorkloadSpec, prepare

# Read at import: the suite's autouse fixture clears PLANNER_* variables before each test.
ARTIFACTS = os.environ.get("PLANNER_TEST_ARTIFACTS")
IN_CI = os.environ.get("CI", "").lower() == "true"
INSTALL = "apt-get install -y chromium chromium-driver (and pip install selenium)"

# Short, but long enough for the planner to scale up on the step and the HPA to react.
WORKLOAD = "step:rates=6/24,at=150,duration=420,isl=2000,osl=200"
POLICIES = ("planner", "hpa")
# The comparison page's policies: a reference too, which the winner rule never names.
COMPARED = (*POLICIES, "oracle")


def _need_browser() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        chromium = None
    if chromium is None or driver is None:
        message = f"no chromium, chromedriver or selenium here: {INSTALL}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return chromium, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver_path = _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1200"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def replay_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("replay-out")
    config = PlannerConfig.model_validate(
        {"profile": "h200_sxm/vllm/llama-3.1-8b-fp8/tp1", "max_gpu_budget": -1}
    )
    plan = prepare(config, WorkloadSpec(workload=WORKLOAD), startup_delay_s=60.0)
    run_policies(plan, COMPARED, out_dir=out, jobs=1, progress=False)
    return out


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(ARTIFACTS) if ARTIFACTS else tmp_path_factory.mktemp("browser-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nbrowser screenshots: {folder}")
    return folder


def _open(driver: Any, page: Path) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")  # drop what an earlier page logged
    driver.get(page.resolve().as_uri())
    expected = len(driver.find_elements("css selector", "section.panel[data-has-plot='1']"))
    assert expected > 0, f"{page}: no panel with a plot"
    WebDriverWait(driver, 60).until(
        lambda d: len(d.find_elements("css selector", ".js-plotly-plot .main-svg")) >= expected
    )


def _check_plots(driver: Any, page: Path) -> None:
    """Every panel that claims a plot has drawn one (an SVG with traces in it); every panel
    without says why."""
    for panel in driver.find_elements("css selector", "section.panel"):
        key = panel.get_attribute("id")
        if panel.get_attribute("data-has-plot") == "1":
            svgs = panel.find_elements("css selector", ".js-plotly-plot svg.main-svg")
            assert svgs, f"{page} {key}: no SVG drawn"
            traces = panel.find_elements("css selector", "g.trace")
            assert traces, f"{page} {key}: an SVG without any trace"
            assert _visible_marks(driver, panel) > 0, f"{page} {key}: traces that draw nothing"
            blank = driver.execute_script(_BLANK_TRACES_JS, panel)
            assert not blank, f"{page} {key}: traces with data that draw nothing: {blank}"
        else:
            text = panel.get_attribute("textContent") or ""
            assert "No data:" in text and len(text) > 40, f"{page} {key}: empty without a why"


# Marks a panel draws: markers, line paths with at least one segment (L, or H/V for steps;
# the path of a lone point between gaps is a bare "M x,y": invisible), and WebGL scatters
# (drawn on a canvas).
_MARKS_JS = """
const panel = arguments[0];
let marks = panel.querySelectorAll('g.trace path.point').length;
for (const line of panel.querySelectorAll('g.trace path.js-line')) {
  if (/[LHVCSQTA]/.test(line.getAttribute('d') || '')) marks += 1;
}
for (const plot of panel.querySelectorAll('.js-plotly-plot')) {
  for (const trace of plot.data || []) {
    if (trace.type === 'scattergl' && (trace.x || []).length) marks += 1;
  }
}
return marks;
"""

# The names of the SVG scatter traces that hold a value and draw no mark.
_BLANK_TRACES_JS = """
const blank = [];
for (const trace of arguments[0].querySelectorAll('g.trace.scatter')) {
  const cd = trace.__data__ || [];
  const values = cd.filter(p => typeof p.y === 'number' && isFinite(p.y)).length;
  if (!values) continue;
  let marks = trace.querySelectorAll('path.point').length;
  for (const line of trace.querySelectorAll('path.js-line')) {
    if (/[LHVCSQTA]/.test(line.getAttribute('d') || '')) marks += 1;
  }
  if (!marks) blank.push((cd[0] && cd[0].trace && cd[0].trace.name) || '?');
}
return blank;
"""


def _visible_marks(driver: Any, panel: Any) -> int:
    return int(driver.execute_script(_MARKS_JS, panel))


def _check_console(driver: Any, page: Path) -> None:
    errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert not errors, f"{page}: console errors {errors}"


def _check_headline(driver: Any, summary: dict[str, Any], scope: str = "") -> None:
    def shown(key: str) -> str:
        selector = f"{scope} [data-key='{key}']".strip()
        return str(driver.find_element("css selector", selector).text)

    att = summary["slo_attainment"]
    assert shown("slo_attainment.both") == f"{att['both']:.2%}"
    assert shown("slo_attainment.ttft") == f"{att['ttft']:.2%}"
    assert shown("slo_attainment.itl") == f"{att['itl']:.2%}"
    assert shown("gpu_hours") == f"{summary['gpu_hours']:.2f}"
    assert shown("gpu_hours_ratio_to_oracle") == f"{summary['gpu_hours_ratio_to_oracle']:.2f}x"
    best = summary.get("gpu_hours_ratio_to_best_static")
    assert shown("gpu_hours_ratio_to_best_static") == (
        "not computed" if best is None else f"{best:.2f}x"
    )
    assert shown("flaps") == str(sum(summary["flaps"].values()))
    assert shown("requests") == str(summary["requests"])


def _screenshot(driver: Any, path: Path) -> None:
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(1400, min(int(height) + 40, 8000))
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1200)
    assert path.stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_policy_report_renders_and_shows_the_summary(
    browser: Any, replay_out: Path, artifacts: Path, policy: str
) -> None:
    folder = replay_out / policy
    page = folder / "report.html"
    # offline: plotly.js inlined, no script fetched from anywhere
    assert not re.search(r"<script[^>]*\bsrc=", page.read_text(encoding="utf-8"))
    _open(browser, page)
    _check_plots(browser, page)
    _check_headline(browser, json.loads((folder / "summary.json").read_text()))
    # the first screen holds the verdict and the capacity panel
    card = browser.find_element("css selector", "section.headline")
    capacity = browser.find_element("css selector", "#panel-capacity")
    assert card.location["y"] < capacity.location["y"] < 1200
    decisions = browser.find_elements("css selector", "section.decisions table.changes tbody tr")
    summary = json.loads((folder / "summary.json").read_text())
    assert len(decisions) == sum(summary["scale_actions"].values())
    # the folded detail draws when opened
    browser.find_element("css selector", "details#detail summary").click()
    _check_plots(browser, page)
    _check_console(browser, page)
    _screenshot(browser, artifacts / f"report-{policy}.png")


# Per plot on the page: the colour of each trace drawn for a policy (its name starts with
# the policy's), as plotly drew it.
_TRACE_COLOURS_JS = """
const out = [];
for (const plot of document.querySelectorAll('.js-plotly-plot')) {
  for (const trace of plot._fullData || []) {
    const colour = (trace.line && trace.line.color) || (trace.marker && trace.marker.color);
    out.push([plot.id, trace.name || '', String(colour || '')]);
  }
}
return out;
"""


def _expected_winner(summaries: dict[str, dict[str, Any]]) -> str:
    """The page's stated rule, written out again: the cheapest policy meeting its target,
    else the highest attainment; the references (oracle, best-static) never."""

    def meets(s: dict[str, Any]) -> bool:
        return bool(s["slo_attainment"]["both"] >= s["slo"]["attainment_target"])

    candidates = {p: s for p, s in summaries.items() if p not in ("oracle", "best-static")}
    meeting = [p for p, s in candidates.items() if meets(s)]
    if meeting:
        return min(meeting, key=lambda p: candidates[p]["gpu_hours"])
    return max(candidates, key=lambda p: candidates[p]["slo_attainment"]["both"])


@pytest.mark.slow
def test_comparison_renders_each_policy(browser: Any, replay_out: Path, artifacts: Path) -> None:
    page = replay_out / "comparison.html"
    assert not re.search(r"<script[^>]*\bsrc=", page.read_text(encoding="utf-8"))
    _open(browser, page)
    # every panel draws, the offered load included, and it is the first
    _check_plots(browser, page)
    panels = [p.get_attribute("id") for p in browser.find_elements("css selector", "section.panel")]
    assert panels[0] == "panel-cmp-load", panels
    assert {"panel-cmp-replicas", "panel-cmp-gpus", "panel-cmp-ttft", "panel-cmp-itl"} <= set(
        panels
    )
    summaries = {p: json.loads((replay_out / p / "summary.json").read_text()) for p in COMPARED}
    for policy, summary in summaries.items():
        _check_headline(browser, summary, scope=f"section.headline[data-policy='{policy}']")

    # the first screen: the winner by the stated rule, then one verdict line per policy
    winner = browser.find_element("css selector", "h2.winner")
    assert winner.get_attribute("data-winner") == _expected_winner(summaries)
    assert winner.location["y"] < 300
    assert "Rule: the winner is the policy with the fewest GPU-hours" in (
        browser.find_element("css selector", "section.comparison-verdicts").text
    )
    lines = browser.find_elements("css selector", "ul.verdicts li")
    assert [li.get_attribute("data-policy") for li in lines] == list(COMPARED)
    for li in lines:
        summary = summaries[str(li.get_attribute("data-policy"))]
        meets = summary["slo_attainment"]["both"] >= summary["slo"]["attainment_target"]
        text = li.text
        assert ("meets the" if meets else "misses the") in text, text
        assert f"{summary['gpu_hours']:.2f} GPU-h" in text, text
        assert li.location["y"] < 1200  # no scrolling to read the verdicts

    # each policy's ticks by reason, in full: no scroll box hides a row
    tally = browser.find_element("css selector", "section.reason-tally")
    assert browser.execute_script("return arguments[0].scrollHeight", tally) <= (
        browser.execute_script("return arguments[0].clientHeight", tally) + 1
    )
    for policy in COMPARED:
        card = tally.find_element("css selector", f".tally[data-policy='{policy}']")
        with (replay_out / policy / "timeline.csv").open() as handle:
            ticks = sum(1 for row in csv.DictReader(handle) if row["event"] == "tick")
        counts = [
            int(td.text) for td in card.find_elements("css selector", "tbody tr td:nth-child(2)")
        ]
        assert sum(counts) == ticks, policy

    # one colour per policy: the key, the verdicts' swatches and every trace drawn for it
    key = {
        e.text.strip("\u25a0 ").strip(): e.get_attribute("data-colour")
        for e in browser.find_elements("css selector", "footer .legend-roles span")
    }
    assert set(key) == set(COMPARED) and len(set(key.values())) == len(COMPARED)
    for li in lines:
        swatch = li.find_element("css selector", ".swatch")
        assert swatch.value_of_css_property("color") == _rgba(
            key[str(li.get_attribute("data-policy"))]
        )
    drawn = browser.execute_script(_TRACE_COLOURS_JS)
    of_policy = [
        (plot, name, colour, p)
        for plot, name, colour in drawn
        for p in COMPARED
        if name == p or name.startswith(f"{p} ")
    ]
    for plot, name, colour, policy in of_policy:
        assert colour.lower() == str(key[policy]).lower(), (plot, name, colour)
    assert {(plot, p) for plot, _, _, p in of_policy} == {
        (f"plot-cmp-{panel}", p) for panel in ("replicas", "gpus", "ttft", "itl") for p in COMPARED
    }
    legend = " ".join(e.text for e in browser.find_elements("css selector", "g.legend text"))
    assert all(policy in legend for policy in COMPARED)
    _check_console(browser, page)
    _screenshot(browser, artifacts / "comparison.png")


def _rgba(hex_colour: str | None) -> str:
    """``#rrggbb`` as the browser computes a CSS colour."""
    assert hex_colour is not None and len(hex_colour) == 7
    r, g, b = (int(hex_colour[k : k + 2], 16) for k in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, 1)"
