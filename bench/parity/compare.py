"""Two runs side by side: normalised records (ids equal; advantages and returns within 1e-6) and
the exported actor (every tensor of every safetensors file within 1e-5).

Why these tolerances: token ids are sampled, so a changed id is changed behaviour; advantages and
returns are float32 sums whose order a refactor may legitimately change in the last bits; the
weights after one update carry that through an optimizer step (fp32 tolerance). Each comparison
reports the first difference by place (episode, index, field, position), so a failure points at
what to read, and the largest deviation, so a pass says how close it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from parity.normalize import Normalised, Record

TOKEN_FIELDS = ("context", "reply", "images")
FLOAT_FIELDS = ("advantages", "returns")
FLOAT_TOL = 1e-6
WEIGHT_TOL = 1e-5


@dataclass
class RecordReport:
    rows_old: int
    rows_new: int
    rows_compared: int = 0
    ids_equal: bool = True
    max_advantages: float = 0.0
    max_returns: float = 0.0
    first: str | None = None  # the first difference, in words

    def note(self, what: str) -> None:
        if self.first is None:
            self.first = what


@dataclass
class WeightReport:
    tensors: int = 0
    max_diff: float = 0.0
    first: str | None = None

    def note(self, what: str) -> None:
        if self.first is None:
            self.first = what


def _first_unequal(old: Sequence, new: Sequence) -> int | None:
    for pos, (a, b) in enumerate(zip(old, new)):
        if a != b:
            return pos
    return None if len(old) == len(new) else min(len(old), len(new))


def _abs_diff(old: Sequence[float], new: Sequence[float]) -> np.ndarray:
    """|old - new| in float64; NaN on both sides counts 0, NaN on one side infinity."""
    a, b = np.asarray(old, dtype=np.float64), np.asarray(new, dtype=np.float64)
    diff = np.abs(a - b)
    diff[np.isnan(a) & np.isnan(b)] = 0.0
    diff[np.isnan(diff)] = math.inf
    return diff


def _compare_record(old: Record, new: Record, report: RecordReport) -> None:
    place = f"episode {old.episode_id} turn {old.index}"
    for field in TOKEN_FIELDS:
        a, b = getattr(old, field), getattr(new, field)
        pos = _first_unequal(a, b)
        if pos is not None:
            if len(a) != len(b) and pos == min(len(a), len(b)):
                report.note(f"{place}: {field} has {len(a)} entries in old, {len(b)} in new")
            else:
                report.note(f"{place}: {field} differs at position {pos} "
                            f"(old {a[pos]}, new {b[pos]})")
    for field in FLOAT_FIELDS:
        a, b = getattr(old, field), getattr(new, field)
        if len(a) != len(b):
            report.note(f"{place}: {field} has {len(a)} entries in old, {len(b)} in new")
            continue
        if not a:
            continue
        diff = _abs_diff(a, b)
        worst = int(diff.argmax())
        attr = f"max_{field}"
        setattr(report, attr, max(getattr(report, attr), float(diff[worst])))
        if diff[worst] > FLOAT_TOL:
            pos = int(np.argmax(diff > FLOAT_TOL))
            report.note(f"{place}: {field} differs at position {pos} by {diff[pos]:.3g} "
                        f"(old {a[pos]!r}, new {b[pos]!r}; tolerance {FLOAT_TOL:g})")


def compare_records(old: Normalised, new: Normalised) -> RecordReport:
    """Row by row in the old file's order, then rows only the new one has, then episode ids."""
    report = RecordReport(rows_old=len(old.records), rows_new=len(new.records))
    for key, record in old.records.items():
        if key not in new.records:
            report.note(f"episode {key[0]} turn {key[1]}: missing in new")
            continue
        report.rows_compared += 1
        _compare_record(record, new.records[key], report)
    for key in new.records:
        if key not in old.records:
            report.note(f"episode {key[0]} turn {key[1]}: only in new")
    report.ids_equal = old.episode_ids == new.episode_ids
    if not report.ids_equal:
        only_old = sorted(old.episode_ids - new.episode_ids)[:3]
        only_new = sorted(new.episode_ids - old.episode_ids)[:3]
        report.note(f"episode ids differ: only in old {only_old}, only in new {only_new}")
    return report


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file  # torch reads every dtype (bf16 included)

    return load_file(str(path))


def compare_weights(old_dir: str | Path, new_dir: str | Path) -> WeightReport:
    """Every *.safetensors file under the two dirs (LoRA merged or not, an image side included):
    the same files, tensor names and shapes; values within WEIGHT_TOL."""
    import torch

    old_dir, new_dir = Path(old_dir), Path(new_dir)
    report = WeightReport()
    old_files = {p.relative_to(old_dir) for p in old_dir.rglob("*.safetensors")}
    new_files = {p.relative_to(new_dir) for p in new_dir.rglob("*.safetensors")}
    if not old_files and not new_files:
        report.note(f"weights: no safetensors under {old_dir} nor {new_dir}")
    if old_files != new_files:
        report.note(f"weights: files differ: only in old {sorted(map(str, old_files - new_files))},"
                    f" only in new {sorted(map(str, new_files - old_files))}")
    for name in sorted(old_files & new_files):
        a, b = _tensors(old_dir / name), _tensors(new_dir / name)
        if set(a) != set(b):
            report.note(f"weights: {name}: tensors only in old {sorted(set(a) - set(b))[:3]}, "
                        f"only in new {sorted(set(b) - set(a))[:3]}")
        for key in sorted(set(a) & set(b)):
            report.tensors += 1
            if a[key].shape != b[key].shape:
                report.note(f"weights: {name}: {key} has shape {tuple(a[key].shape)} in old, "
                            f"{tuple(b[key].shape)} in new")
                continue
            x, y = a[key].double().flatten(), b[key].double().flatten()
            diff = (x - y).abs()
            diff[x.isnan() & y.isnan()] = 0.0
            diff[diff.isnan()] = math.inf
            if diff.numel() == 0:
                continue
            worst = int(torch.argmax(diff))
            report.max_diff = max(report.max_diff, float(diff[worst]))
            if diff[worst] > WEIGHT_TOL:
                report.note(f"weights: {name}: {key} differs by {float(diff[worst]):.3g} at flat "
                            f"index {worst} (tolerance {WEIGHT_TOL:g})")
    return report
