"""`hf-tpu report`: one self-contained page; and in a real headless Chromium, its charts, tables and filters
render with the right numbers (a screenshot is saved)."""

from __future__ import annotations

import os
import re
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.ci.browser import BrowserError, dump_dom, file_url, find_chromium, screenshot
from harness.ci.sample import demo_rows, row, write_run
from harness.cli import main

ROOT = Path(__file__).resolve().parents[3]
SCREENSHOT = Path(os.environ.get("HF_TPU_SCREENSHOT", ROOT / "reports" / "screenshots" / "dashboard.png"))


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two runs: an older one (worse) and the demo run, compared with expected results accepted from the
    older one, so the page has a trend and comparison classes."""
    tmp = tmp_path_factory.mktemp("dash")
    old_rows = demo_rows(timestamp="2026-01-01T03:00:00Z")
    for r in old_rows:  # a day earlier llama crashed in both modes
        if r["entry_id"] == "transformers/llama/LlamaForCausalLM":
            r.update(status="crash", error_type="SIGSEGV", error_message="worker died with signal 11",
                     max_abs_err="", max_rel_err="", cosine="", rmse_ratio="")
    old = write_run(tmp / "2026-01-01", old_rows)
    new = write_run(tmp / "2026-01-02", demo_rows(timestamp="2026-01-02T03:00:00Z"))
    assert main(["accept", str(old), "--expected", str(tmp / "expected")]) == 0
    assert main(["compare", str(new), "--expected", str(tmp / "expected")]) == 1  # llama IMPROVED
    # Runs given newest first: the page orders them by timestamp.
    assert main(["report", str(new), str(old), "--out", str(tmp / "dashboard.html")]) == 0
    return tmp / "dashboard.html"


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append((tag, dict(attrs)))


def test_page_is_self_contained(page: Path) -> None:
    html = page.read_text()
    p = _Collect()
    p.feed(html)
    tags = [t for t, _ in p.tags]
    # Nothing is fetched: no external scripts, stylesheets, images, fonts or frames.
    assert not [a for t, a in p.tags if t in ("script", "img", "iframe") and a.get("src")]
    assert "link" not in tags
    assert not re.search(r"https?://|url\(|@import", html)
    assert tags.count("svg") == 4 and "script" in tags and "style" in tags


def test_page_numbers_without_a_browser(page: Path) -> None:
    html = page.read_text()
    assert '<div class="big">64.7%</div>' in html and "11 of 17 rows" in html
    assert '<div class="big">81.8%</div>' in html and "9 of 11 rows" in html
    assert 'data-class="IMPROVED" data-count="2"' in html  # llama, eager and compiled
    assert "Trend over 2 runs" in html


def test_train_rows_beside_inference_with_performance(tmp_path: Path) -> None:
    """A run with both phases: each phase's figures, train/<mode> bars beside the modes, per-phase task charts,
    the performance section, and train rows in the table (filterable as train/eager) with their class."""
    perf = {"first_run_s": 2.5, "warmup_s": 1.25, "run_s": 0.5, "peak_rss_mb": 912.0, "wall_s": 7.5}
    rows = [row("m/a", mode="eager", **perf), row("m/a", phase="train", mode="eager", **perf),
            row("m/b", mode="eager", **perf),
            row("m/b", phase="train", mode="eager", status="fail_to_run", error_type="RuntimeError",
                error_message="step 1 optimizer: boom", failed_at="step 1 optimizer", wall_s=99.0)]
    run = write_run(tmp_path / "run", rows)
    assert main(["accept", str(run), "--expected", str(tmp_path / "expected")]) == 0
    assert main(["compare", str(run), "--expected", str(tmp_path / "expected")]) == 0
    assert main(["report", str(run), "--out", str(tmp_path / "d.html")]) == 0
    html = (tmp_path / "d.html").read_text()
    card = html.split('id="crash-free-train"')[1].split("</div></div>")[0]
    assert 'data-num="1" data-den="2"' in card and "50.0%" in card
    assert 'id="numerics-match-inference" data-num="2" data-den="2"' in html
    assert 'data-group="train/eager"' in html.split('id="chart-mode"')[1].split("</svg>")[0]
    assert 'id="chart-task-train"' in html and 'id="chart-task"' in html
    medians = html.split('id="perf-medians"')[1].split("</table>")[0]
    assert "<td>train/eager</td>" in medians and "912" in medians
    slowest = html.split('id="perf-slowest"')[1].split("</table>")[0]
    assert slowest.index("m/b") < slowest.index("m/a")  # 99 s of wall time first
    assert 'data-mode="train/eager"' in html and '<option value="train/eager">' in html
    assert html.count('data-cls="PASS"') == 4


def test_report_default_output_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = write_run(tmp_path / "r", [row("m/a"), row("m/b", status="crash", error_type="X")])
    assert main(["report", str(run)]) == 0
    assert (run / "dashboard.html").is_file()
    assert "crash-free 50.0% (1/2)" in capsys.readouterr().out
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.csv").write_text("nope\n")
    assert main(["report", str(bad), str(run)]) == 2
    assert "lacks the schema column" in capsys.readouterr().err
    # A run with no rows yet (header only) still renders, with n/a figures rather than 0 % or 100 %.
    empty = write_run(tmp_path / "empty", [])
    assert main(["report", str(empty)]) == 0
    assert "crash-free n/a (0/0)" in capsys.readouterr().out
    assert '<div class="big">n/a</div>' in (empty / "dashboard.html").read_text()
    # --skip-unreadable leaves out a broken history run, never the last RUN.
    assert main(["report", str(bad), str(run), "--skip-unreadable"]) == 0
    assert main(["report", str(run), str(bad), "--skip-unreadable"]) == 2


# ---------------------------------------------------------------- real browser

CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not found: `apt-get install chromium` (Debian) or set $CHROMIUM; .ci/run installs it",
)


def _attrs(dom: str, tag: str, **want: str) -> list[dict]:
    p = _Collect()
    p.feed(dom)
    return [a for t, a in p.tags if t == tag and all(a.get(k) == v for k, v in want.items())]


class _TextOf(HTMLParser):
    """Text content of the element with a given id, nested elements included."""

    VOID = {"meta", "br", "img", "input", "link", "hr", "circle", "rect", "line", "polyline"}

    def __init__(self, elem_id: str) -> None:
        super().__init__()
        self.elem_id, self.depth, self.found, self.parts = elem_id, 0, False, []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if self.depth:
            self.depth += tag not in self.VOID
        elif dict(attrs).get("id") == self.elem_id:
            self.depth, self.found = 1, True

    def handle_endtag(self, tag: str) -> None:
        if self.depth and tag not in self.VOID:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.parts.append(data)


def _text(dom: str, elem_id: str) -> str:
    p = _TextOf(elem_id)
    p.feed(dom)
    assert p.found, f"#{elem_id} not in the DOM"
    return " ".join(" ".join(p.parts).split())


@pytest.mark.browser
@needs_chromium
def test_browser_renders_charts_tables_and_filters(page: Path) -> None:
    try:
        dom = dump_dom(file_url(page))
    except BrowserError as exc:
        pytest.fail(str(exc))
    assert 'data-js="ready"' in dom, "the page's script did not run"
    # Headline figures with their denominators.
    assert "64.7%" in _text(dom, "crash-free") and "11 of 17" in _text(dom, "crash-free")
    assert "81.8%" in _text(dom, "numerics-match") and "9 of 11" in _text(dom, "numerics-match")
    # Charts: laid out at their size, one bar per group, segments proportional to the counts.
    for chart in ("chart-mode", "chart-task", "chart-library", "trend-chart"):
        (svg,) = _attrs(dom, "svg", id=chart)
        assert int(svg["data-rendered-width"]) > 400 and int(svg["data-rendered-height"]) > 50, chart
    bars = {a["data-group"]: a for a in _attrs(dom, "g", **{"class": "bar"})}
    assert (bars["eager"]["data-crash-free"], bars["eager"]["data-denominator"]) == ("6", "9")
    assert (bars["compiled"]["data-numerics-match"], bars["compiled"]["data-ran"]) == ("4", "5")
    assert "crash-free 66.7% (6/9)" in dom and "numerics 80.0% (4/5)" in dom
    mode_chart = dom.split('id="chart-mode"')[1].split("</svg>")[0]
    (svg,) = _attrs(dom, "svg", id="chart-mode")
    scale = int(svg["data-rendered-width"]) / int(svg["width"])  # the page may scale charts to fit
    eager_pass = _attrs(mode_chart, "rect", **{"class": "seg", "data-status": "pass"})[0]
    # eager: 11 rows, 5 pass -> 5/11 of the 430 px bar, as measured by the browser.
    assert eager_pass["data-count"] == "5"
    assert abs(float(eager_pass["data-rendered-width"]) - 430 * 5 / 11 * scale) < 1.0
    # Trend: two runs in time order, both series.
    points = _attrs(dom, "circle", **{"class": "trend-point", "data-series": "crash_free"})
    assert [p["data-run"] for p in points] == ["2026-01-01", "2026-01-02"]
    assert [p["data-pct"] for p in points] == ["52.9", "64.7"]  # llama crashed twice on 2026-01-01: 9/17
    # Crash table sorted by entries affected; worst numerics first row.
    crash_rows = re.findall(r"<tr><td class=\"num\" data-v=\"(\d+)\"", dom.split('id="crash-table"')[1].split("</table>")[0])
    assert crash_rows[0] == "2" and crash_rows == sorted(crash_rows, reverse=True)
    assert "transformers/vit/ViTForImageClassification" in dom.split('id="numerics-table"')[1].split("</tr>")[1]
    # Per-entry table: all rows shown without a filter.
    assert "showing 22 of 22 rows" in _text(dom, "entries-count")


@pytest.mark.browser
@needs_chromium
def test_browser_filters_from_the_url(page: Path) -> None:
    dom = dump_dom(file_url(page, "status=@run_failure&mode=eager"))
    # eager run failures: t5 fail_to_run, vae crash, test/oom oom.
    assert "showing 3 of 22 rows" in _text(dom, "entries-count")
    shown = re.findall(r'<tr data-status="([^"]+)" data-mode="([^"]+)"[^>]*data-text="[^"]*">', dom)
    assert sorted(shown) == [("crash", "eager"), ("fail_to_run", "eager"), ("oom", "eager")]
    dom = dump_dom(file_url(page, "q=int4pack"))
    assert "showing 3 of 22 rows" in _text(dom, "entries-count")
    dom = dump_dom(file_url(page, "class=IMPROVED"))
    assert "showing 2 of 22 rows" in _text(dom, "entries-count")


@pytest.mark.browser
@needs_chromium
def test_browser_screenshot(page: Path) -> None:
    out = screenshot(file_url(page), SCREENSHOT, 1280, 2000)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1280, 2000)
    # A blank or unstyled page compresses to a few kB; the dashboard's charts and tables do not.
    assert len(data) > 60_000, f"screenshot suspiciously small ({len(data)} bytes): {out}"
    print(f"screenshot: {out}")
