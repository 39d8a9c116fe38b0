"""dvc.yaml deps cover the code each stage runs: derived from the imports of the stage's script.

A hand-written deps list drifts as modules are added (train once ran `longturn/distributed.py`
and `longturn/run/models.py` without listing them, so editing them did not rerun it). This test
follows every import of `components/<stage>.py` within the repository, transitively (imports
inside functions too, and `module:factory` strings such as the env registry's built-ins), and
fails naming each reached file that no listed file or directory covers.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("components", "longturn")
SCRIPT = re.compile(r"\bcomponents/(\w+)\.py\b")
PLUGIN_STRING = re.compile(r"^((?:%s)(?:\.\w+)+):\w+$" % "|".join(PACKAGES))  # module:factory


def module_file(name: str) -> Path | None:
    """The repository file of a dotted module name (a package's __init__.py), or None."""
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def package_inits(name: str) -> list[Path]:
    """__init__.py of every package on the way to `name` (importing a.b.c runs a and a.b)."""
    parts = name.split(".")
    inits = (module_file(".".join(parts[:i])) for i in range(1, len(parts)))
    return [p for p in inits if p is not None and p.name == "__init__.py"]


def imported_names(path: Path) -> set[str]:
    """Dotted names a file may import: import statements anywhere, and `module:factory` strings
    (what the env registry imports by name)."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # submodule imports
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = PLUGIN_STRING.match(node.value)
            if match:
                names.add(match.group(1))
    return {n for n in names if n.split(".")[0] in PACKAGES}


def reached_files(script: Path) -> set[Path]:
    """Every repository file the script runs, following imports transitively."""
    seen: set[Path] = set()
    todo = [script]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_names(path):
            found = module_file(name)
            todo += [p for p in [*package_inits(name), found] if p is not None]
    return seen


def covered(path: Path, deps: list[str]) -> bool:
    rel = path.relative_to(ROOT)
    return any(rel == Path(d) or Path(d) in rel.parents for d in deps)


def dep_paths(stage: dict) -> list[str]:
    return [d if isinstance(d, str) else next(iter(d)) for d in stage.get("deps", [])]


STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_deps_cover_the_code_it_runs(name):
    stage = STAGES[name]
    scripts = SCRIPT.findall(stage["cmd"])
    assert scripts, f"dvc.yaml stage {name!r}: no components/<stage>.py in its cmd"
    deps = dep_paths(stage)
    missing = set()
    for script in scripts:
        missing |= {p for p in reached_files(ROOT / "components" / f"{script}.py")
                    if not covered(p, deps)}
    assert not missing, (f"dvc.yaml stage {name!r} runs these files but does not list them "
                         f"in deps: {sorted(str(p.relative_to(ROOT)) for p in missing)}")


USER_CODE_KEYS = ("agent", "slime_generate")  # rollout keys naming code by `module:function`


def shipped_user_code() -> set[Path]:
    """The files of the agents and generate functions the shipped profiles name."""
    files = set()
    for profile in (ROOT / "configs" / "profiles").glob("*.yaml"):
        rollout = (yaml.safe_load(profile.read_text()) or {}).get("rollout") or {}
        for key in USER_CODE_KEYS:
            if rollout.get(key):
                found = module_file(rollout[key].partition(":")[0])
                assert found is not None, f"{profile.name}: rollout.{key} names no file here"
                files.add(found)
    return files


def reads_user_code(stage: dict) -> bool:
    params = [p if isinstance(p, str) else next(iter(p)) for p in stage.get("params", [])]
    return any(p in ("rollout", *(f"rollout.{k}" for k in USER_CODE_KEYS)) for p in params)


@pytest.mark.parametrize("name", sorted(n for n, s in STAGES.items() if reads_user_code(s)))
def test_stages_that_run_user_code_depend_on_the_shipped_examples(name):
    """A stage whose params name the agent runs its file too, which no import reaches."""
    files = shipped_user_code()
    assert files, "no shipped profile names rollout.agent or rollout.slime_generate"
    deps = dep_paths(STAGES[name])
    missing = sorted(str(f.relative_to(ROOT)) for f in files if not covered(f, deps))
    assert not missing, f"dvc.yaml stage {name!r} runs {missing} but does not list them"


def test_walker_follows_function_imports_and_plugin_strings():
    reached = {str(p.relative_to(ROOT)) for p in reached_files(ROOT / "components/zero_shot_eval.py")}
    assert "longturn/engines/hf.py" in reached  # imported inside the registry's factory
    assert "longturn/envs/babyai/__init__.py" in reached  # a 'module:factory' string
    assert "longturn/__init__.py" in reached


def test_every_dep_exists():
    for name, stage in STAGES.items():
        for dep in dep_paths(stage):
            if not dep.startswith("data/"):
                assert (ROOT / dep).exists(), f"dvc.yaml stage {name!r}: dep {dep!r} does not exist"
