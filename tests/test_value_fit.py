"""Explained variance is a number only where the returns vary: near-constant returns (a few ended
episodes paying the same reward) give NaN, logged as a gap and reported as "not meaningful"."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import torch

from longturn.algo.ppo import explained_variance
from longturn.algo.value_fit import RETURN_VARIANCE_FLOOR
from longturn.report.build import build_report, read_live_metrics
from longturn.report.plots import curve_keys, CURVE_KEYS
from longturn.report.training import training_reading, warmup_reading
from longturn.report.value_fit import explained_variance_series
from test_report import write_live

ALL = torch.ones(1, 16, dtype=torch.bool)


def test_near_constant_returns_give_nan_not_a_large_negative_number():
    returns = torch.full((1, 16), 1.0)
    returns[0, :8] += 0.01  # variance 2.5e-5: the returns barely move
    values = returns + 0.06 * torch.linspace(-1, 1, 16)  # a decent critic
    assert math.isnan(explained_variance(values, returns, ALL))  # was 1 − 0.0014/2.5e-5 ≈ −53.4
    spread = torch.linspace(0.0, 1.0, 16)[None]  # returns that vary: the number is kept
    assert explained_variance(spread + 0.01, spread, ALL).item() == 1.0
    assert torch.var(returns, unbiased=False) < RETURN_VARIANCE_FLOOR < torch.var(spread)


def metrics(ev: list[float], return_variance: list[float] | None) -> pd.DataFrame:
    columns = {"mean_reward": [0.1] * len(ev), "explained_variance": ev}
    if return_variance is not None:
        columns["return_variance"] = return_variance
    return pd.DataFrame(columns, index=pd.Index(range(len(ev)), name="step"))


def test_reading_says_not_meaningful_instead_of_a_number():
    nan = float("nan")  # as logged: no point where the returns did not vary
    df = metrics([0.1, nan, nan, 0.4], [0.5, 1e-5, 2e-4, 0.2])
    [line] = [s for s in training_reading(df, []) if "explained variance" in s]
    assert line.startswith("- explained variance: 0.100 → 0.400 over 2 iteration(s); not "
                           "meaningful (variance of the returns below 0.001")
    assert line.endswith("in 2 more.")
    never = metrics([nan, nan], [1e-5, 0.0])
    assert [s for s in training_reading(never, []) if "explained" in s] == [
        "- explained variance: not meaningful (variance of the returns below 0.001: "
        "near-constant returns) in all 2 iteration(s)."]
    warm = pd.DataFrame({"value_loss": [2.0, 1.0], "return_variance": [1e-6, 1e-6]})
    assert "not meaningful" in warmup_reading(warm)[-1]


def test_a_number_logged_before_the_floor_is_left_out_of_readings_and_plots():
    df = metrics([0.1, -33.5, 0.4], [0.5, 1e-4, 0.2])  # a run from before the floor
    assert list(explained_variance_series(df)) == [0.1, 0.4]
    assert "-33.5" not in "".join(training_reading(df, []))


def test_a_panel_stays_for_explained_variance_that_was_never_meaningful():
    df = metrics([float("nan")] * 3, [0.0] * 3)
    assert "explained_variance" in curve_keys(df, CURVE_KEYS)
    assert "explained_variance" not in curve_keys(metrics([float("nan")] * 3, None), CURVE_KEYS)


def test_report_says_not_meaningful_and_does_not_list_it_as_missing(tmp_path: Path):
    live = write_live(tmp_path, "train/live", {
        "train/mean_reward": [0.0, 0.1, 0.2], "train/value_loss": [1.0, 0.8, 0.5],
        "train/explained_variance": [float("nan")] * 3,  # NaN is not logged, as MetricsLog does
        "train/return_variance": [2e-5, 0.0, 1e-4]})
    assert "explained_variance" not in read_live_metrics(live).columns
    out = tmp_path / "report"
    text = build_report(tmp_path / "a", tmp_path / "b", live, tmp_path / "c", out, {}).read_text()
    assert "- explained variance: not meaningful" in text and "in all 3 iteration(s)" in text
    missing = text.split("## Missing inputs")[1]
    assert "value_loss" not in missing and "explained_variance" not in missing
    assert (out / "curves.png").read_bytes().startswith(b"\x89PNG")
