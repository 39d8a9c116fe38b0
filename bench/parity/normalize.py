"""A trajectory file as schema-neutral records: one per trained reply, keyed by (episode id,
turn-or-segment index), with the ids the model saw, the ids it sampled, and advantages and
returns at the trained tokens.

Why: issue 22 replaces schema version 1's two layouts (a row per turn; a row per episode in
sequence mode) with one (version 2: a row per sample, its replies as spans). Records are what
all of them must agree on, so a file of any layout compares with any other. The normaliser is chosen by what the file says about itself (its
`longturn.schema_version` and `longturn.mode` metadata): a new layout is one entry in NORMALISERS.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyarrow.parquet as pq

from parity import ParityError


@dataclass(frozen=True)
class Record:
    """One trained reply. `advantages` and `returns` are empty where nothing is trained (an
    aborted turn); `images` are the sha256 of the frames placed before the reply."""

    episode_id: str
    index: int
    context: tuple[int, ...]
    reply: tuple[int, ...]
    advantages: tuple[float, ...]
    returns: tuple[float, ...]
    images: tuple[str, ...] = ()


@dataclass(frozen=True)
class Normalised:
    """Records in file order, and every episode the file holds (one without a reply included)."""

    records: dict[tuple[str, int], Record]
    episode_ids: frozenset[str]


def _keyed(path: Path, records: list[Record]) -> dict[tuple[str, int], Record]:
    out: dict[tuple[str, int], Record] = {}
    for record in records:
        key = (record.episode_id, record.index)
        if key in out:
            raise ParityError(f"{path}: episode {key[0]} index {key[1]} appears twice")
        out[key] = record
    return out


def turn_v1(path: Path, rows: list[dict]) -> Normalised:
    """§4: a row per turn; context = prompt_ids, reply = response_ids; an aborted turn is out of
    the loss, so it has no trained tokens."""
    records = []
    for row in rows:
        trained = not row["aborted"]
        records.append(Record(
            episode_id=row["episode_id"], index=int(row["turn"]),
            context=tuple(row["prompt_ids"]), reply=tuple(row["response_ids"]),
            advantages=tuple(row["advantages"] or ()) if trained else (),
            returns=tuple(row["returns"] or ()) if trained else ()))
    return Normalised(_keyed(path, records), frozenset(r["episode_id"] for r in rows))


def sequence_v1(path: Path, rows: list[dict]) -> Normalised:
    """§4b: a row per episode; reply i is input_ids[start_i:end_i], its context everything
    before it, its advantages and returns the same slice of theirs."""
    records = []
    for row in rows:
        ids, adv, ret = row["input_ids"], row["advantages"] or (), row["returns"] or ()
        frames = list(zip(row.get("image_starts") or (), row.get("images") or ()))
        for index, (start, end) in enumerate(zip(row["segment_starts"], row["segment_ends"])):
            images = tuple(hashlib.sha256(png).hexdigest() for pos, png in frames if pos < start)
            records.append(Record(
                episode_id=row["episode_id"], index=index, context=tuple(ids[:start]),
                reply=tuple(ids[start:end]), advantages=tuple(adv[start:end]),
                returns=tuple(ret[start:end]), images=images))
    return Normalised(_keyed(path, records), frozenset(r["episode_id"] for r in rows))


def sample_v2(path: Path, rows: list[dict]) -> Normalised:
    """§4 (v2): a row per sample, its replies spans [start, end) of response_ids; reply r's
    context is prompt_ids + response_ids[:start], its advantages and returns the same slice of
    theirs (none where the reply is aborted); frames are placed in prompt_ids + response_ids."""
    records = []
    for row in rows:
        prompt, response = row["prompt_ids"] or [], row["response_ids"] or []
        adv, ret = row["advantages"] or (), row["returns"] or ()
        frames = list(zip(row.get("image_starts") or (), row.get("images") or ()))
        for reply in row["replies"] or ():
            start, end, trained = reply["start"], reply["end"], not reply["aborted"]
            at = len(prompt) + start
            images = tuple(hashlib.sha256(png).hexdigest() for pos, png in frames if pos < at)
            records.append(Record(
                episode_id=row["episode_id"], index=int(reply["turn"]),
                context=tuple(prompt) + tuple(response[:start]), reply=tuple(response[start:end]),
                advantages=tuple(adv[start:end]) if trained else (),
                returns=tuple(ret[start:end]) if trained else (), images=images))
    return Normalised(_keyed(path, records), frozenset(r["episode_id"] for r in rows))


Normaliser = Callable[[Path, list[dict]], Normalised]
# (schema_version, mode) as the file's metadata says; a file without `mode` is turn mode
NORMALISERS: dict[tuple[str, str], Normaliser] = {
    ("1", "turn"): turn_v1,
    ("1", "sequence"): sequence_v1,
    ("2", "turn"): sample_v2,  # one schema for both: a turn is a sample with one reply
    ("2", "sequence"): sample_v2,
}


def file_layout(path: Path) -> tuple[str, str]:
    """(schema_version, mode) from the file's `longturn.*` metadata."""
    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, ValueError) as err:
        raise ParityError(f"{path}: not a readable Parquet file ({err})") from err
    version = meta.get(b"longturn.schema_version")
    if version is None:
        raise ParityError(f"{path}: no longturn.schema_version in its metadata")
    return version.decode(), meta.get(b"longturn.mode", b"turn").decode()


def normalise(path: str | Path) -> Normalised:
    """The records of one trajectory file, by the normaliser its metadata names."""
    path = Path(path)
    layout = file_layout(path)
    if layout not in NORMALISERS:
        known = ", ".join(f"{v}/{m}" for v, m in NORMALISERS)
        raise ParityError(f"{path}: schema version {layout[0]!r} (mode {layout[1]!r}) has no "
                          f"normaliser; known: {known}")
    try:
        rows = pq.read_table(path).to_pylist()
        return NORMALISERS[layout](path, rows)
    except KeyError as err:
        raise ParityError(f"{path}: no column {err} (schema {layout[0]}/{layout[1]})") from err
