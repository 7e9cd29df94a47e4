"""Sweep figures: drawn once per content, then copied from the cache (a rerun logs every figure again)."""
from __future__ import annotations

import pandas as pd

from dvfs_mlops.mlops.sweep import plots


def _summary(energy_816: float = 40.0) -> pd.DataFrame:
    """Two workloads at maxn, 510 and 816 MHz; `energy_816` is bert-tiny/sst2's energy at 816 MHz."""
    rows = []
    for model, task in (("bert-tiny", "sst2"), ("pythia-14m", "rte")):
        for f, e, t in (("maxn", 55.0, 1.0), ("510", 45.0, 2.0), ("816", 40.0, 1.4)):
            e = energy_816 if (model, f) == ("bert-tiny", "816") else e
            rows.append({"model": model, "task": task, "freq_mhz": f, "energy_j": e, "time_s": t, "avg_power_w": e / t,
                         "device_profile": "sim-orin-measured"})
    return pd.DataFrame(rows)


def test_a_figure_is_drawn_once_per_content_and_copied_after(tmp_path, monkeypatch):
    monkeypatch.setenv("DVFS_CACHE_DIR", str(tmp_path / "cache"))
    first, again, changed = (tmp_path / d for d in ("first", "again", "changed"))
    for d in (first, again, changed):
        d.mkdir()
    drawn: list[str] = []
    real_draw = plots._draw

    def counting_draw(title, g, path):
        drawn.append(title)
        real_draw(title, g, path)

    monkeypatch.setattr(plots, "_draw", counting_draw)
    paths = plots.plot_workload_curves(_summary(), first, simulated=True)
    assert sorted(p.name for p in paths) == ["bert-tiny_sst2.png", "pythia-14m_rte.png"]
    assert sorted(drawn) == ["bert-tiny / sst2  (SIMULATED: sim-orin-measured twin)", "pythia-14m / rte  (SIMULATED: sim-orin-measured twin)"]
    assert all(p.stat().st_size > 10_000 for p in paths)  # real PNGs

    drawn.clear()
    again_paths = plots.plot_workload_curves(_summary(), again, simulated=True)
    assert drawn == []  # the same rows: copied, nothing drawn
    assert [p.read_bytes() for p in again_paths] == [p.read_bytes() for p in paths]

    plots.plot_workload_curves(_summary(energy_816=38.0), changed, simulated=True)
    assert drawn == ["bert-tiny / sst2  (SIMULATED: sim-orin-measured twin)"]  # only the workload whose rows changed
    assert (changed / "bert-tiny_sst2.png").read_bytes() != (first / "bert-tiny_sst2.png").read_bytes()
    assert (changed / "pythia-14m_rte.png").read_bytes() == (first / "pythia-14m_rte.png").read_bytes()


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path, monkeypatch):
    blocked = tmp_path / "cache-is-a-file"
    blocked.write_text("")
    monkeypatch.setenv("DVFS_CACHE_DIR", str(blocked))  # workloads/figures/ cannot be made under a file
    out = tmp_path / "out"
    out.mkdir()
    paths = plots.plot_workload_curves(_summary(), out, simulated=False)
    assert len(paths) == 2 and all(p.stat().st_size > 10_000 for p in paths)
