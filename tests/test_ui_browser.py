"""The MLflow UI in a real browser: headless Chromium shows a smoke sweep's child runs and their energy_j.

It starts where a user starts: the deep link the sweep printed, opened in a fresh browser profile (so
nothing remembered from an earlier visit picks the GenAI or "Model training" mode; the link itself must
land on the runs table). Then it drives the runs table as a user would: expand the sweep's parent run,
pick energy_j under Columns, and read each child's energy back from the grid. Skipped with a reason when
Chromium/chromedriver or selenium are missing; `.ci/run` installs Debian's chromium and
chromium-driver so CI runs it. Screenshots are saved under the test's tmp dir.
"""
from __future__ import annotations

import math
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.test_server import sqlite_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")

# The grid renders the run-name column (pinned left) and the other columns (centre) as two row sets
# that share a `row-index`; the expander is the icon button of MLflow's run-name cell renderer.
NAME_ROWS = ".ag-pinned-left-cols-container .ag-row"
VALUE_ROWS = ".ag-center-cols-container .ag-row"
EXPANDER = "button[data-component-id*='runnamecellrenderer']"
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")


def _browser(tmp: Path):
    pytest.importorskip("selenium", reason="needs selenium (pip install -e '.[dev]')")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp / 'profile'}",
                 "--window-size=1920,1000"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


def _wait(get: Callable[[], Any], what: str, ok: Callable[[Any], bool] = bool, timeout: float = 90) -> Any:
    """Poll get() until ok(value); an element going stale while React re-renders counts as not yet."""
    from selenium.common.exceptions import WebDriverException

    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = get()
            if ok(last):
                return last
        except WebDriverException:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last seen: {str(last)[:1000]}")


def _rows(driver, selector: str) -> dict[str, str]:
    return {r.get_attribute("row-index"): r.text for r in driver.find_elements("css selector", selector) if r.is_displayed()}


def test_sweep_child_runs_and_energy_column_in_the_mlflow_ui(tmp_path, store_template):
    server = sqlite_server(tmp_path, store_template)
    try:
        env = {"MLFLOW_TRACKING_URI": server.uri}
        r = run_cli("sweep", "--preset", "smoke", "--models", "bert-tiny", "--tasks", "sst2", "--steps", "2", env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        printed = [line for line in r.stdout.splitlines() if line.strip()][-1]
        assert printed.startswith("open in the MLflow UI: "), r.stdout[-2000:]  # a server: no `mlflow ui` to start
        link = printed.removeprefix("open in the MLflow UI: ")
        from mlflow.tracking import MlflowClient

        c = MlflowClient(tracking_uri=server.uri)
        exp = c.get_experiment_by_name("dvfs-sweep")
        children = [x for x in c.search_runs([exp.experiment_id]) if "dvfs.point" in x.data.tags]
        assert len(children) == 4
        energy = {x.info.run_name: x.data.metrics["energy_j"] for x in children}
        assert link == f"{server.uri}/#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning", link
        driver = _browser(tmp_path)
        try:
            driver.get(link)  # the mode toggle is never touched: the link alone must open the runs table
            _wait(lambda: driver.find_element("tag name", "body").text, "the runs table", ok=lambda t: "5 matching runs" in t)
            for close in driver.find_elements("css selector", "button[aria-label='Close']"):  # the assistant side panel
                if close.is_displayed():
                    close.click()

            # 1. nested runs are collapsed under the sweep's parent run: expand it, the four points appear
            # (the "5 matching runs" count can be drawn before the grid's rows: wait for the rows themselves)
            names = _wait(lambda: _rows(driver, NAME_ROWS), "the sweep's parent run, alone in the runs table", ok=len)
            assert len(names) == 1 and "sweep sweep-" in next(iter(names.values())), names
            driver.find_element("css selector", EXPANDER).click()
            names = _wait(lambda: _rows(driver, NAME_ROWS), "the sweep's child runs after expanding it",
                          ok=lambda rows: all(any(n in t for t in rows.values()) for n in energy))
            assert len(names) == 5, names

            # 2. add the energy_j column from the Columns menu
            driver.find_element("xpath", "//button[normalize-space()='Columns']").click()
            _wait(lambda: driver.find_element("xpath", "//span[@title='energy_j']"), "energy_j in the Columns menu").click()
            driver.find_element("tag name", "body").send_keys("\ue00c")  # Escape closes the menu
            header = _wait(lambda: next((h for h in driver.find_elements("xpath", "//div[contains(@class,'ag-header')]//*[text()='energy_j']")
                                         if h.is_displayed()), None), "the energy_j column header")
            driver.execute_script("arguments[0].scrollIntoView({inline: 'center'})", header)

            # 3. each child's row shows its own energy_j (the grid prints the float MLflow stored)
            def shown() -> dict[str, list[float]] | None:
                names, values = _rows(driver, NAME_ROWS), _rows(driver, VALUE_ROWS)
                out = {}
                for name in energy:
                    idx = next((i for i, t in names.items() if name in t), None)
                    if idx is None or idx not in values:
                        return None
                    out[name] = [float(v) for v in NUMBER.findall(values[idx])]
                return out

            cells = _wait(shown, f"energy_j values {energy} in the child rows",
                          ok=lambda s: bool(s) and all(any(math.isclose(v, energy[n], rel_tol=1e-6) for v in s[n]) for n in energy))
            assert set(cells) == set(energy)
            time.sleep(1)  # let the scroll settle before the picture
            driver.save_screenshot(str(tmp_path / "runs-energy.png"))
            assert (tmp_path / "runs-energy.png").stat().st_size > 10_000

            # 4. a child's own page shows energy_j too
            child = children[0]
            from dvfs_mlops.mlops import tracking

            driver.get(tracking.run_link(child.info.run_id, exp.experiment_id, uri=server.uri).url)
            text = _wait(lambda: driver.find_element("tag name", "body").text, "the child run page", ok=lambda t: "energy_j" in t)
            driver.save_screenshot(str(tmp_path / "child-run.png"))
            assert child.info.run_name in text, text[:2000]

            # 5. a registered version: the link `registry bootstrap` printed opens the version's page
            r = run_cli("registry", "bootstrap", env=env, timeout=300)
            assert r.returncode == 0, r.stderr[-2000:]
            printed = [line for line in r.stdout.splitlines() if line.strip()][-1]
            assert printed == f"open in the MLflow UI: {server.uri}/#/models/dvfs-governor/versions/1?workflowType=machine_learning", r.stdout[-2000:]
            driver.get(printed.removeprefix("open in the MLflow UI: "))
            text = _wait(lambda: driver.find_element("tag name", "body").text, "the model version page",
                         ok=lambda t: "Version 1" in t and "dvfs-governor" in t)
            driver.save_screenshot(str(tmp_path / "model-version.png"))
        finally:
            driver.quit()
    finally:
        server.stop()
