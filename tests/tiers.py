"""Test tiers by rule: `slow` and `network` are derived from what a test does, never set by hand.

Why: hand-applied markers drift — a new test that trains or starts a stage joins the fast tier
silently and `make test-fast` creeps back to half an hour. Here a test is `slow` when its own
source, the fixtures it requests or the test-local helpers they call (followed transitively
through names defined under tests/) start a stage or training subprocess, `dvc repro`/`dvc exp
run`, kfp.local, torchrun, the SGLang stand-in, or call `run_training`; or when its module is in
SLOW_MODULES (heavy work the source rule cannot see). `network` marks what needs a package
index. The `--max-fast-call-s` option fails the run, naming each test, when a fast-tier test
(neither `slow` nor `network`: an index's speed is not ours) took longer than that in its call
phase: the tiers cannot drift unnoticed.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

COMPONENTS = Path(__file__).resolve().parent.parent / "components"

STAGES = sorted(p.stem for p in COMPONENTS.glob("*.py")
                if p.stem not in ("__init__", "common"))
SLOW_PATTERNS = {
    "a stage subprocess": r"components/[\w{}]+\.py",
    "a stage in process": rf"\b({'|'.join(STAGES)})\.main\(",
    "a bench script": r"\bBENCH\b|bench/\w+\.py",
    "a training loop": r"\brun_training\(",
    "dvc repro / dvc exp run": r"""["']repro["']|dvc repro|["']exp["'],\s*["']run["']|dvc exp run""",
    "kfp.local": r"""\bkfp\.local\b|\blocal\.init\(|pipeline_cli\(["']local["']""",
    "torchrun": r"torch\.distributed\.run|\btorchrun\b",
    "the SGLang stand-in": r"\bstandin_env\b|sglang\.launch_server",
    "a GPU campaign run": r"bench/gpu_campaign\.py",
}
NETWORK_PATTERNS = {
    "pip resolution against an index": r"""pypi\.org|["']--dry-run["']|pip install --dry-run""",
}
# Modules whose cost the rule cannot see from source (in-process training of real models or
# envs); each entry says why.
SLOW_MODULES = {
    "test_vision.py": "PPO updates on image frames through a tiny LLaVA",
}

_SLOW = {why: re.compile(p) for why, p in SLOW_PATTERNS.items()}
_NETWORK = {why: re.compile(p) for why, p in NETWORK_PATTERNS.items()}


def _defined_in_tests(obj: Any, test_dir: Path) -> bool:
    """Defined in a test file or test helper (followed), not in the library or a package."""
    try:
        path = Path(inspect.getsourcefile(obj) or "").resolve()
    except TypeError:
        return False
    return path.is_relative_to(test_dir) and ".venv" not in path.parts


def _names(source: str) -> set[str]:
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return set()
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


class SourceReach:
    """The text a test can reach: its function, its fixtures and the test-local functions,
    classes and string constants they name, transitively (cached across items)."""

    def __init__(self, test_dir: Path) -> None:
        self._text: dict[int, str] = {}
        self.test_dir = test_dir

    def text(self, obj: Any) -> str:
        key = id(obj)
        if key in self._text:
            return self._text[key]
        self._text[key] = ""  # breaks cycles
        try:
            source = inspect.getsource(obj)
        except (OSError, TypeError):
            return ""
        parts = [source]
        module_ns = getattr(inspect.getmodule(obj), "__dict__", {})
        for name in sorted(_names(source)):
            target = module_ns.get(name)
            if isinstance(target, str):
                parts.append(target)
            elif ((inspect.isfunction(target) or inspect.isclass(target))
                  and _defined_in_tests(target, self.test_dir)):
                parts.append(self.text(target))
        self._text[key] = "\n".join(parts)
        return self._text[key]

    def of_item(self, item: pytest.Function) -> str:
        parts = [self.text(item.function)]
        for defs in item._fixtureinfo.name2fixturedefs.values():
            func = defs[-1].func
            if _defined_in_tests(func, self.test_dir):
                parts.append(self.text(func))
        for name in item.fixturenames:  # fixture names are evidence too (standin_env)
            parts.append(name)
        return "\n".join(parts)


def reasons(text: str, patterns: dict[str, re.Pattern[str]]) -> list[str]:
    return [why for why, pattern in patterns.items() if pattern.search(text)]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--max-fast-call-s", type=float, default=None,
                     help="fail the run, naming the test, when a fast-tier test takes "
                          "longer than this many seconds in its call phase (CI: 30)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: starts stages, training, DVC, kfp, torchrun or "
                                       "the SGLang stand-in (applied by rule in tests/tiers.py)")
    config.addinivalue_line("markers", "network: needs a package index (applied by rule)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reaches: dict[Path, SourceReach] = {}
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        test_dir = Path(str(item.fspath)).resolve().parent
        text = reaches.setdefault(test_dir, SourceReach(test_dir)).of_item(item)
        slow = reasons(text, _SLOW)
        module_why = SLOW_MODULES.get(Path(str(item.fspath)).name)
        if module_why:
            slow.append(module_why)
        if slow:
            item.add_marker(pytest.mark.slow(reason="; ".join(slow)))
        network = reasons(text, _NETWORK)
        if network:
            item.add_marker(pytest.mark.network(reason="; ".join(network)))


_OVER_LIMIT_KEY = "over_fast_tier_limit_s"  # a report's user property: the call's seconds


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """A fast-tier call over the limit fails in its own report: counted and shown with the other
    failures, and carried by the report wherever the summary is written."""
    report = yield
    limit = item.config.getoption("--max-fast-call-s")
    fast_tier = not (item.get_closest_marker("slow") or item.get_closest_marker("network"))
    if (limit is not None and report.when == "call" and fast_tier and report.passed
            and report.duration > limit):
        report.outcome = "failed"
        report.longrepr = (f"call took {report.duration:.1f} s > {limit:g} s outside `slow`; "
                           "make it cheaper, or make tests/tiers.py see why it is slow")
        report.user_properties.append((_OVER_LIMIT_KEY, report.duration))
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Each failed report that carries the limit's mark, named with its seconds."""
    over = [(report.nodeid, seconds) for report in terminalreporter.stats.get("failed", [])
            for key, seconds in getattr(report, "user_properties", ())
            if key == _OVER_LIMIT_KEY]
    if not over:
        return
    limit = config.getoption("--max-fast-call-s")
    terminalreporter.section("tests outside `slow` over the fast tier's limit", red=True)
    for nodeid, seconds in over:
        terminalreporter.line(f"FAILED {nodeid}: call took {seconds:.1f} s > {limit:g} s; "
                              "make it cheaper, or make tests/tiers.py see why it is slow")
