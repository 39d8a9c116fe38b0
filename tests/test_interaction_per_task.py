"""Several interactions in one run, picked per task the way verl picks them: with
rollout.chat.interaction null each task's `interaction_kwargs["name"]` names its interaction in a
verl-format file; set, it is one interaction for every episode. A name the file does not declare,
or no name among several, stops the run naming the episode, the name and the file's names."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from transformers import AutoTokenizer

from longturn.engines.hf import HFEngine
from longturn.errors import SettingError
from longturn.params.config import parse_params
from longturn.rollout.conversation_rollout import conversation_rollout
from longturn.rollout.conversation_setup import ConversationRun
from longturn.tasks.arithmetic import task_record
from settings_from_params import sampling_settings

# verl's interaction config layout: two entries, this project's interaction and a verl-style one
TWO_INTERACTIONS = """\
interaction:
  - name: "revise"
    class_name: "longturn.tasks.arithmetic.RevisionInteraction"
    config: {max_revisions: 1}
  - name: "verl_revise"
    class_name: "verl_style_plugins.ReviseInteraction"
    config: {}
"""
OURS = "I do not see an 'ANSWER: <number>' line."  # RevisionInteraction, as the model rarely
VERLS = "Your response is incorrect! Try again."   # ends with an answer line


def run_of(tmp_path, **chat) -> ConversationRun:
    path = tmp_path / "interactions.yaml"
    path.write_text(TWO_INTERACTIONS)
    params = parse_params({"env": {"tasks": ["arithmetic"]},
                           "rollout": {"protocol": "chat", "context": "episode",
                                       "chat": {"interactions": str(path), **chat}}})
    return ConversationRun.from_params(params, progress=False)


def task(seed: int, **interaction_kwargs) -> dict:
    record = task_record(seed)
    record["interaction_kwargs"] = {**record["interaction_kwargs"], **interaction_kwargs}
    return record


class NoEngine:
    """An engine that must not be reached: the name is checked before any reply."""

    def generate(self, prompts, sampling, **kwargs):
        raise AssertionError("generated before the interactions were checked")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return HFEngine(tiny_model_dir, dtype="float32"), AutoTokenizer.from_pretrained(tiny_model_dir)


def user_turns(record: dict, task: dict) -> list[str]:
    played = json.loads(record["messages"])[len(task["messages"]):]
    return [m["content"] for m in played if m["role"] == "user"]


def test_each_task_talks_to_the_interaction_it_names(tmp_path, tiny):
    engine, tokenizer = tiny
    run = run_of(tmp_path)
    settings = replace(run.settings, max_assistant_turns=2, max_user_turns=1, max_tokens=1024)
    ours, verls = settings.interaction["revise"], settings.interaction["verl_revise"]
    started: dict[str, list[str]] = {"revise": [], "verl_revise": []}
    for name, method in (("revise", "start"), ("verl_revise", "start_interaction")):
        inner = getattr(settings.interaction[name], method)

        def spy(instance_id, *args, _inner=inner, _name=name, **kwargs):
            started[_name].append(instance_id)
            return _inner(instance_id, *args, **kwargs)
        setattr(settings.interaction[name], method, spy)
    tasks = [task(1, name="revise"), task(2, name="verl_revise", ground_truth="-7"),
             task(3, name="revise"), task(4, name="verl_revise", ground_truth="-7")]
    records = conversation_rollout(engine, tokenizer, sampling_settings(
        max_new_tokens=8, temperature=1.0, seed=0), tasks, settings)
    assert started == {"revise": ["seq-0", "seq-2"], "verl_revise": ["seq-1", "seq-3"]}
    for record, t in zip(records, tasks):
        users = user_turns(record, t)
        mine = VERLS if t["interaction_kwargs"]["name"] == "verl_revise" else OURS
        assert users and all(text.startswith(mine) for text in users)
    assert ours.instances == {} and verls._instance_dict == {}  # each finalized its own


def test_a_named_interaction_is_every_episodes(tmp_path, tiny):
    engine, tokenizer = tiny
    settings = replace(run_of(tmp_path, interaction="verl_revise").settings,
                       max_assistant_turns=2, max_user_turns=1, max_tokens=1024)
    tasks = [task(1, name="revise", ground_truth="-7"), task(2, ground_truth="-7")]
    records = conversation_rollout(engine, tokenizer, sampling_settings(
        max_new_tokens=8, temperature=1.0, seed=0), tasks, settings)
    assert [user_turns(r, t) for r, t in zip(records, tasks)] == [[VERLS], [VERLS]]


def test_an_unknown_or_missing_name_is_one_line_naming_it(tmp_path, tiny):
    settings, tokenizer = run_of(tmp_path).settings, tiny[1]
    with pytest.raises(SettingError) as err:
        conversation_rollout(NoEngine(), tokenizer, sampling_settings(), [task(1, name="revise"),
                             task(2, name="quiz")], settings)
    assert str(err.value) == ("episode seq-1 (task 'arithmetic'): interaction_kwargs name 'quiz' "
                              "is not in rollout.chat.interactions (it declares ['revise', "
                              "'verl_revise'])")
    with pytest.raises(SettingError, match=r"^episode seq-0 \(task 'arithmetic'\): "
                       r"interaction_kwargs has no 'name' and rollout.chat.interactions "
                       r"declares \['revise', 'verl_revise'\]: name one"):
        conversation_rollout(NoEngine(), tokenizer, sampling_settings(), [task(1)], settings)
