"""The params text compiled into the pipeline: the file as written, minus its `kubeflow:` section.

Kubeflow caches a task on its inputs, and the params text is one of them. Cluster placement
(volume, requests, node selector) changes nothing a stage computes, so it is left out: moving a
run to other nodes reuses the cached tasks. Comments and key order stay, so the compiled YAML
reads like the file.
"""

from __future__ import annotations

import re

import yaml

SECTION = "kubeflow"
_TOP_LEVEL = re.compile(r"^[^\s#]")  # a line that starts a new top-level key (or document)


def without_section(text: str, section: str = SECTION) -> str:
    """`text` with the top-level `section` removed; checked by parsing both, and re-dumped from
    the parsed mapping in the rare layout the line scan cannot cut cleanly."""
    lines = text.splitlines(keepends=True)
    kept, inside = [], False
    for line in lines:
        if _TOP_LEVEL.match(line):
            inside = line.startswith(f"{section}:")
        if not inside:
            kept.append(line)
    stripped = "".join(kept).rstrip("\n") + "\n"
    expected = dict(yaml.safe_load(text) or {})
    expected.pop(section, None)
    if (yaml.safe_load(stripped) or {}) == expected:
        return stripped
    return yaml.safe_dump(expected, sort_keys=False)
