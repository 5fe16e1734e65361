"""The A/B dashboard in a real headless Chromium (Debian's package, driven through its chromedriver):
the page loads with no network beyond the service, its numbers equal the results JSON, the
guardrail's stop shows as a banner, both charts draw, and a screenshot is kept as an artifact."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving.settings import ServingSettings
from dinrec.streams.inprocess import InProcessStream
from tests.conftest import ADMIN_HEADERS, REPO, wait_until
from tests.serving.conftest import live_server
from tests.serving.test_guardrail import EXPERIMENT, buys, traffic

ARTIFACTS = REPO / ".artifacts"
RISKY = 'section[data-experiment="risky"]'


def _browser():
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        if os.environ.get("DINREC_REQUIRE_SERVICES") == "1":
            pytest.fail("chromium and chromium-driver (Debian packages) are required; .ci/run installs them")
        pytest.skip("no chromium / chromedriver on this machine (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,1400"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def test_the_dashboard_shows_the_results_the_json_gives(tiny_run, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    path = tmp_path / "experiments.json"
    path.write_text(json.dumps({"experiments": [{**EXPERIMENT, "ramp": [0.5, 1.0], "ramp_hold_s": 3600}]}))
    store = MemoryStore()
    settings = ServingSettings(bundle_dir=tiny_run[2], experiments_file=path, events_sink="store",
                               guardrail_interval_s=0.3, guardrail_min_users=50, score_precision="fp32")
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as c:
        store.write(traffic("control", 150, 10, 1) + traffic("bad", 150, 10, 0) + traffic("same", 150, 10, 1))
        store.write(buys("control", 40, 1) + buys("bad", 30, 1) + buys("same", 50, 2))  # after their exposure
        wait_until(lambda: len(c.get("/experiments/risky/results").json()["timeline"]) >= 1, timeout_s=20,
                   what="a first snapshot")
        store.write(traffic("control", 150, 10, 1, "b") + traffic("bad", 150, 10, 0, "b")
                    + traffic("same", 150, 10, 1, "b"))
        # a snapshot that counts the second batch (one taken just before it landed counts 150 users still)
        wait_until(lambda: (lambda r: len(r["timeline"]) >= 2 and "bad" in r["stopped"] and sum(
            d["users"]["control"] for d in r["results"]["srm"]["traffic_per_day"]) == 300)(
            c.get("/experiments/risky/results").json()), timeout_s=20, what="a snapshot of both batches and the stop")
        want = c.get("/experiments/risky/results").json()
        # A second experiment, run and stopped through the admin API: its results are kept as they stood.
        done = {"name": "done", "status": "running", "owner": "ranking team", "hypothesis": "b is clicked more",
                "variants": [{"name": "control"}, {"name": "b"}]}
        assert c.put("/admin/experiments/done", json=done, headers=ADMIN_HEADERS).status_code == 200
        store.write(traffic("control", 60, 10, 1, "done", "done") + traffic("b", 60, 10, 2, "done", "done"))
        assert c.post("/admin/experiments/done/status", json={"status": "stopped"},
                      headers=ADMIN_HEADERS).status_code == 200
        final = c.get("/experiments/done/results").json()
        assert final["frozen_at"] is not None and final["results"]["variants"]["control"]["users"] == 60
        browser = _browser()
        try:
            browser.get(f"{c.base_url}/dashboard")
            WebDriverWait(browser, 20).until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-loaded"))
            for variant, numbers in want["results"]["variants"].items():
                row = browser.find_element(By.CSS_SELECTOR, f'{RISKY} table.results tr[data-variant="{variant}"]')
                for field in ("users", "impressions", "clicks"):
                    shown = row.find_element(By.CSS_SELECTOR, f'td[data-field="{field}"]').text
                    assert int(shown.replace(",", "")) == numbers[field], (variant, field)
                ctr = row.find_element(By.CSS_SELECTOR, 'td[data-field="ctr"]').text
                assert ctr == f"{100 * numbers['ctr']:.2f}%"
                tail = row.find_element(By.CSS_SELECTOR, 'td[data-field="long_tail"]').text
                assert tail == f"{100 * numbers['long_tail_click_share']:.1f}%"
            banner = browser.find_element(By.CSS_SELECTOR, '[data-banner="stopped"]')
            assert banner.get_attribute("data-variant") == "bad" and "guardrail" in banner.text
            ramp = browser.find_element(By.CSS_SELECTOR, '[data-banner="ramp"]')  # held at its first step
            assert [r["step"] for r in want["ramp"]] == [0] and "50%" in ramp.text and "held" in ramp.text
            # The decision leads: the always-valid interval and p; the fixed-horizon p is there, marked.
            bad = browser.find_element(By.CSS_SELECTOR, f'{RISKY} table.results tr[data-variant="bad"]')
            row = next(c for c in want["results"]["comparisons"] if c["variant"] == "bad")
            assert bad.find_element(By.CSS_SELECTOR, 'td[data-field="decision"]').text == "worse"
            assert row["p_sequential"] < 0.001
            assert bad.find_element(By.CSS_SELECTOR, 'td[data-field="p_sequential"]').text == "< 0.001"
            assert bad.find_element(By.CSS_SELECTOR, 'td[data-field="users_still_needed"]').text == "decided"
            same = next(c for c in want["results"]["comparisons"] if c["variant"] == "same")
            same_row = browser.find_element(By.CSS_SELECTOR, f'{RISKY} table.results tr[data-variant="same"]')
            shown_p = same_row.find_element(By.CSS_SELECTOR, 'td[data-field="p_sequential"]')
            assert float(shown_p.text) == pytest.approx(same["p_sequential"], rel=5e-3)
            needed = want["results"]["power"]["variants"]["same"]["users_still_needed"]
            shown = same_row.find_element(By.CSS_SELECTOR, 'td[data-field="users_still_needed"]')
            assert needed is not None and shown.text.startswith(f"{needed:,}")
            # Three metrics, a row per treatment each: the goal first, then the guardrail, then the secondary.
            metrics = want["results"]["metrics"]
            shown_rows = browser.find_elements(By.CSS_SELECTOR, f"{RISKY} table.metrics tbody tr")
            assert [(r.get_attribute("data-metric"), r.get_attribute("data-variant")) for r in shown_rows] == [
                (m, v) for m in ("ctr", "conversions_per_user", "value_per_user") for v in ("bad", "same")]
            buys_row = browser.find_element(By.CSS_SELECTOR, f'{RISKY} table.metrics tr[data-metric='
                                                             f'"conversions_per_user"][data-variant="same"]')
            per_user = metrics["conversions_per_user"]
            assert per_user["variants"]["same"]["mean"] == pytest.approx(100 / 300)  # 50 users, 2 buys each
            assert buys_row.find_element(By.CSS_SELECTOR, 'td[data-field="value"]').text == "0.333"
            assert buys_row.find_element(By.CSS_SELECTOR, 'td[data-field="role"]').text == "guardrail"
            (same_buys,) = [r for r in per_user["comparisons"] if r["variant"] == "same"]
            assert buys_row.find_element(By.CSS_SELECTOR, 'td[data-field="lift"]').text == \
                f"{100 * same_buys['lift']:.1f}%"
            stopped_row = browser.find_element(By.CSS_SELECTOR, f'{RISKY} table.metrics tr[data-metric="ctr"]'
                                                                f'[data-variant="bad"]')
            assert "as stopped" in stopped_row.find_element(By.CSS_SELECTOR, 'td[data-field="decision"]').text
            # The breakdown, folded away and marked exploratory: only new users here, the stopped arm left out.
            segments = {g["segment"]: g for g in want["results"]["breakdown"]["segments"]}
            assert segments["new"]["users"] == {"control": 300, "same": 300} and segments["light"]["users"]["same"] == 0
            folded = browser.find_elements(By.CSS_SELECTOR, f"{RISKY} table.breakdown tbody tr")
            assert [(r.get_attribute("data-segment"), r.get_attribute("data-metric"), r.get_attribute("data-variant"))
                    for r in folded] == [("new", m, "same") for m in ("ctr", "conversions_per_user", "value_per_user")]
            summary = browser.find_element(By.CSS_SELECTOR, f"{RISKY} details.breakdown summary").text
            assert "exploratory" in summary
            # The power calculator: its answer is the plan endpoint's, and a new lift changes it.
            def days() -> str | None:
                # Read in one script: the calculator re-renders its answer, and an element found in one
                # call can be replaced before the next reads it (a stale reference)
                return browser.execute_script(
                    'const e = document.querySelector(\'[data-field="days_needed"]\');'
                    ' return e ? e.getAttribute("data-days") : null;')

            WebDriverWait(browser, 20).until(lambda b: days() is not None)
            planned = c.get("/experiments/plan", params={"mean": 0.05, "sd": 0.08, "users_per_day": 2000,
                                                         "effect": 0.05, "variations": 2, "sequential": "true",
                                                         "days": 56}).json()
            assert days() == str(planned["days_needed"])
            effect = browser.find_element(By.CSS_SELECTOR, '#plan-form input[name="effect"]')
            effect.clear()
            effect.send_keys("0.2")
            browser.find_element(By.CSS_SELECTOR, '#plan-form button').click()
            WebDriverWait(browser, 20).until(lambda b: days() != str(planned["days_needed"]))
            sooner = days()
            assert sooner is not None and int(sooner) < planned["days_needed"]  # a larger lift is found sooner
            assert len(browser.find_elements(By.CSS_SELECTOR, "table.plan tbody tr")) == 8  # a row per week
            assert browser.find_elements(By.CSS_SELECTOR, f"{RISKY} svg.lift-chart circle")  # a lift point each
            assert browser.find_elements(By.CSS_SELECTOR, f"{RISKY} svg.ctr-chart polyline")
            # The list: every experiment with its status, owner and hypothesis; the stopped one's final results.
            listed = {r.get_attribute("data-experiment"): r for r in
                      browser.find_elements(By.CSS_SELECTOR, "table.list tbody tr")}
            assert set(listed) == {"risky", "done"}
            assert listed["done"].find_element(By.CSS_SELECTOR, 'td[data-field="status"]').text == "stopped"
            assert listed["done"].find_element(By.CSS_SELECTOR, 'td[data-field="owner"]').text == "ranking team"
            section = browser.find_element(By.CSS_SELECTOR, 'section[data-experiment="done"]')
            assert "Final results" in section.find_element(By.CSS_SELECTOR, '[data-banner="frozen"]').text
            clicks = section.find_element(By.CSS_SELECTOR, 'tr[data-variant="b"] td[data-field="clicks"]').text
            assert int(clicks.replace(",", "")) == final["results"]["variants"]["b"]["clicks"] > 0
            per_day = want["results"]["srm"]["traffic_per_day"]  # the day's new users, per variant
            control_users = want["results"]["variants"]["control"]["users"]
            assert per_day and sum(d["users"]["control"] for d in per_day) == control_users
            today = browser.find_element(By.CSS_SELECTOR, f'{RISKY} table.traffic tr[data-day="{per_day[-1]["day"]}"]')
            shown = today.find_element(By.CSS_SELECTOR, 'td[data-variant="control"]').text
            assert int(shown.replace(",", "")) == per_day[-1]["users"]["control"]
            assert want["results"]["correction"] == "holm"  # two treatments: said under the table
            assert "Holm-corrected over the 2 treatments" in browser.find_element(
                By.CSS_SELECTOR, '[data-field="correction"]').text
            # The effect over time: a lift line and its band per treatment, on a labelled time axis.
            assert want["timeline_resolution"] == "snapshot" and all("effects" in p for p in want["timeline"])
            assert len(browser.find_elements(By.CSS_SELECTOR, f"{RISKY} svg.effect-chart polyline.lift")) == 2
            assert len(browser.find_elements(By.CSS_SELECTOR, f"{RISKY} svg.effect-chart polygon.band")) == 2
            ticks = [t.text for t in browser.find_elements(By.CSS_SELECTOR, f"{RISKY} svg.effect-chart text.x-tick")]
            assert len(ticks) >= 2 and all(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in ticks), ticks  # seconds apart
            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / "dashboard.png"
            assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        finally:
            browser.quit()


def test_the_dashboard_takes_the_results_token_once_from_its_address(tiny_run, tmp_path):
    """Beyond loopback with DINREC_RESULTS_TOKEN: without the token the page says how to give it; opened as
    /dashboard#token=…, it loads, and the token leaves the address bar (the tab keeps it)."""
    from pydantic import SecretStr
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.serving.test_experiments_api import RESULTS_TOKEN

    path = tmp_path / "experiments.json"
    path.write_text(json.dumps({"experiments": [EXPERIMENT]}))
    settings = ServingSettings(bundle_dir=tiny_run[2], experiments_file=path, events_sink="store", host="0.0.0.0",
                               anonymous_users=True, results_token=SecretStr(RESULTS_TOKEN), score_precision="fp32")
    auth = {"authorization": f"Bearer {RESULTS_TOKEN}"}
    with live_server(settings, FeatureStoreSettings(), store=MemoryStore(), stream=InProcessStream()) as c:
        for u in range(30):  # served lists: what each arm served shows under the metrics
            assert c.get("/recommend", params={"user_id": f"web-{u}", "k": 5}).status_code == 200
        wait_until(lambda: sum(x["lists"] for x in c.get("/experiments/risky/results", headers=auth).json()[
            "results"]["served"].values()) == 30, what="the 30 lists tallied")
        served = c.get("/experiments/risky/results", headers=auth).json()["results"]["served"]
        browser = _browser()
        try:
            browser.get(f"{c.base_url}/dashboard")
            error = WebDriverWait(browser, 20).until(
                lambda b: b.find_elements(By.CSS_SELECTOR, '[data-banner="error"]'))[0]
            assert "results token" in error.text and "/dashboard#token=" in error.text
            browser.get(f"{c.base_url}/dashboard#token={RESULTS_TOKEN}")
            browser.refresh()  # a fragment change alone does not reload the page
            WebDriverWait(browser, 20).until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-loaded"))
            assert browser.find_elements(By.CSS_SELECTOR, RISKY)
            assert "token" not in browser.current_url
            for variant, x in served.items():
                row = browser.find_element(By.CSS_SELECTOR, f'{RISKY} table.served tr[data-variant="{variant}"]')
                assert int(row.find_element(By.CSS_SELECTOR, 'td[data-field="lists"]').text) == x["lists"]
                assert row.find_element(By.CSS_SELECTOR, 'td[data-field="latency_p95_ms"]').text == \
                    f"{x['latency_p95_ms']:.1f} ms"
                assert int(row.find_element(By.CSS_SELECTOR, 'td[data-field="distinct_items"]').text) == \
                    x["distinct_items"] > 0
        finally:
            browser.quit()
