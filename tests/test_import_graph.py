"""The house drawn from the imports: no circle among longturn's modules, algo/ builds only on the
layers below it, a protocol's record is read only where it is played, and the light stages load
neither torch nor the trainer."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# what algo/ may build on: the foundations, the engines' tensor layout and the image side of a
# vision-language model (vision/: below engines, needing none of them), the profiler's marks
# (profiling: torch alone), the estimator table (a value of the settings, not their schema: algo
# is handed dataclasses, never Params), nothing that runs it
ALGO_MAY_IMPORT = ("longturn.algo", "longturn.engines", "longturn.errors", "longturn.atomic",
                   "longturn.device", "longturn.distributed", "longturn.trajectories",
                   "longturn.reply_format", "longturn.vision", "longturn.profiling",
                   "longturn.params.estimator")


def _modules() -> dict[str, Path]:
    out = {}
    for path in (ROOT / "longturn").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module → longturn modules it imports, at any depth of its code (function-level too)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(parts + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                candidates = [f"{target}.{alias.name}" for alias in node.names] + [target]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            for candidate in candidates:
                while candidate and candidate not in modules:
                    candidate = candidate.rpartition(".")[0]
                if candidate and candidate != name:
                    graph[name].add(candidate)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_finder_sees_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle() -> None:
    assert cycles(import_graph()) == []


def test_algo_imports_only_the_layers_below_it() -> None:
    graph = import_graph()
    upward = {f"{m} -> {t}" for m, targets in graph.items() if m.startswith("longturn.algo")
              for t in targets if not t.startswith(ALGO_MAY_IMPORT)}
    assert not upward


# what turns the rollout's own record (a conversation record) into samples
RECORD_READERS = {"sample_from_episode", "samples_from_episodes", "samples_from_window"}
# where records are played, so converted: rollout/, and the agent's own collector in serve/
MAY_READ_RECORDS = ("longturn.rollout.", "longturn.serve.agent_turns")


def test_only_the_rollout_converts_a_protocol_s_record() -> None:
    """Collectors, evaluation and validation hand on samples: nothing above rollout/ sees a
    conversation record (one sample schema from there up)."""
    readers = set()
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "longturn.rollout.samples":
                readers |= {f"{name}: {a.name}" for a in node.names if a.name in RECORD_READERS}
    assert readers and all(r.startswith(MAY_READ_RECORDS) for r in readers), sorted(readers)


@pytest.mark.parametrize("stage", ["report", "prepare_model"])
def test_light_stages_load_neither_torch_nor_the_trainer(stage: str) -> None:
    code = (f"import sys; import components.{stage}; "
            "print(sorted({'torch', 'deepspeed', 'longturn.algo.trainer'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]"
