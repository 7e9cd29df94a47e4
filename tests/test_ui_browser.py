"""The MLflow UI in a real browser: headless Chromium shows a smoke sweep's child runs and energy_j.

Skipped with a reason when Chromium/chromedriver or selenium are missing; `.ci/run` installs
Debian's chromium and chromium-driver so CI runs it.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.test_server import Server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")


def _browser(tmp: Path):
    pytest.importorskip("selenium", reason="needs selenium (pip install -e '.[dev]')")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp / 'profile'}",
                 "--window-size=1600,1000"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


def _wait_for(driver, predicate, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = driver.find_element("tag name", "body").text
        if predicate(text):
            return text
        time.sleep(1)
    return driver.find_element("tag name", "body").text


def test_sweep_runs_and_energy_column_in_the_mlflow_ui(tmp_path):
    server = Server(tmp_path)
    try:
        env = {"MLFLOW_TRACKING_URI": server.uri}
        r = run_cli("sweep", "--preset", "smoke", "--models", "bert-tiny", "--tasks", "sst2", "--steps", "2", env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        from mlflow.tracking import MlflowClient

        c = MlflowClient(tracking_uri=server.uri)
        exp = c.get_experiment_by_name("dvfs-sweep")
        children = [x for x in c.search_runs([exp.experiment_id]) if "dvfs.point" in x.data.tags]
        driver = _browser(tmp_path)
        try:
            driver.get(f"{server.uri}/#/experiments/{exp.experiment_id}/runs")
            text = _wait_for(driver, lambda t: "sweep " in t)
            assert "sweep sweep-" in text, text[:2000]
            driver.save_screenshot(str(tmp_path / "experiment.png"))
            assert "5 matching runs" in text  # the parent and its 4 nested point runs
            # the parent run's page lists its child runs; a child's page shows energy_j
            driver.get(f"{server.uri}/#/experiments/{exp.experiment_id}/runs/{children[0].info.run_id}")
            text = _wait_for(driver, lambda t: "energy_j" in t)
            driver.save_screenshot(str(tmp_path / "child-run.png"))
            assert "energy_j" in text and children[0].info.run_name in text, text[:2000]
            assert (tmp_path / "experiment.png").stat().st_size > 10_000
        finally:
            driver.quit()
    finally:
        server.stop()
