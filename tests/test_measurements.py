"""Evidence kept: every link into docs/measurements/ from README.md or docs/ resolves, every
evidence folder has its summary, and the GPU figures that have no folder say so."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEASUREMENTS = ROOT / "docs" / "measurements"
LINK = re.compile(r"\]\(([^)#\s]+)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_links_into_measurements_resolve():
    for page in pages():
        for target in LINK.findall(page.read_text()):
            if "measurements" in target and "://" not in target:
                path = (page.parent / target).resolve()
                assert path.exists(), f"{page.relative_to(ROOT)} links to missing {target}"


def test_every_evidence_folder_has_a_summary_and_a_row():
    index = (MEASUREMENTS / "README.md").read_text()
    for folder in sorted(p for p in MEASUREMENTS.iterdir() if p.is_dir()):
        assert (folder / "summary.md").is_file() and (folder / "results.json").is_file(), folder
        assert f"]({folder.name}/summary.md)" in index, f"{folder.name} is not listed"


def test_gpu_figures_without_a_folder_are_marked_prose_only():
    for page in (ROOT / "README.md", ROOT / "docs" / "profiles.md"):
        one_gpu = page.read_text().split("## One GPU", 1)[1].split("\n## ", 1)[0]
        if "measurements/" not in one_gpu:
            assert "prose only" in one_gpu, f"{page.name}: an H100 figure with no evidence folder"
