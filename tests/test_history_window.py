"""A history window for conversation episodes (`rollout.context: window`): which messages
a reply is given, how the window is rendered (tools and frames included), what the rollout gives
the engine and records, the samples an episode becomes (one per reply, chained by slot and step),
and that scoring and GAE run over them unchanged."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gae_reference import reference_gae
from longturn.algo.gae import GAEParams
from longturn.algo.group_advantages import GroupParams
from longturn.algo.model_set import ModelSet
from longturn.algo.sample_scoring import sample_frames, score_samples
from longturn.engines.base import Completion
from longturn.errors import SettingError
from longturn.params.config import Params, parse_params
from longturn.rollout.chat_deltas import ChatDeltas
from longturn.rollout.history_window import (Joined, frame_owners, render_window,
                                             window_frames, window_messages)
from longturn.rollout.samples import (sample_from_episode, samples_from_episodes,
                                      samples_from_window)
from longturn.rollout.sample_metrics import sample_metrics
from longturn.rollout.conversation_rollout import (ConversationSettings, chat_deltas,
                                                   conversation_rollout, lock_step, release_all,
                                                   start_episodes)
from longturn.tasks.arithmetic import TASK, make_problem, task_record
from longturn.tasks.env_frames import BABYAI_GOTO_FRAMES
from longturn.tasks.interactions import load_interactions
from longturn.tasks.tools import ToolBox, load_tools
from longturn.trajectories import write_samples
from longturn.vision.frames import from_png
from settings_from_params import sampling_settings, conversation_settings
from reference_forward import random_head_critic, state_values

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 4  # positions per frame of the fake vision side below
GAE = GAEParams(gamma_step=0.9, lambda_step=0.8, gamma_token=0.99, lambda_token=0.95)


def message(role: str, content: str = "") -> dict:
    return {"role": role, "content": content or role}


# ------------------------------------------------------------------ which messages


def test_the_window_is_the_task_and_the_last_n_turns():
    head = [message("system"), message("user", "problem")]
    turns = [[message("assistant", f"r{k}"), message("tool", f"t{k}")] for k in range(4)]
    messages = head + [m for turn in turns for m in turn]
    assert window_messages(messages, 2, 2) == [0, 1, 6, 7, 8, 9]  # replies 2 and 3
    assert window_messages(messages, 2, 1) == [0, 1, 8, 9]
    assert window_messages(messages, 2, 4) == list(range(10))  # not more turns than there are
    assert window_messages(messages[:2], 2, 1) == [0, 1]  # the first reply: the task alone
    # a turn is a reply and everything after it: a tool result and a user turn both
    longer = messages + [message("user", "again")]
    assert window_messages(longer, 2, 1) == [0, 1, 8, 9, 10]
    with pytest.raises(ValueError, match="0 turns"):
        window_messages(messages, 2, 0)


def test_the_window_and_its_frames_read_from_the_end_equal_their_definition():
    """`window_messages` reads back from the last message and `window_frames` bisects (flat
    cost late in an episode); over random episodes they must pick what the definition says: the
    task's messages, then from the `turns`-th last assistant message on when an older one
    exists, else everything after the task's; the frames of exactly those messages."""
    rng = np.random.default_rng(0)
    for _ in range(500):
        head = int(rng.integers(0, 4))
        roles = rng.choice(["assistant", "tool", "user"], size=int(rng.integers(0, 12)))
        messages = [message("system")] * head + [message(str(r)) for r in roles]
        turns = int(rng.integers(1, 5))
        starts = [i for i in range(head, len(messages)) if messages[i]["role"] == "assistant"]
        first = starts[-turns] if len(starts) > turns else head
        assert window_messages(messages, head, turns) == [*range(head),
                                                          *range(first, len(messages))]
        cut = int(rng.integers(0, len(messages) + 1))  # as the rollout asks before appending
        assert window_messages(Joined(messages[:cut], messages[cut:]), head, turns) == \
            window_messages(messages, head, turns)
        owners = sorted(int(o) for o in rng.integers(0, len(messages) + 1, size=5))
        kept = [j for j, owner in enumerate(owners) if owner < head or owner >= first]
        assert window_frames(owners, head, first) == kept
        assert window_frames(Joined(owners[:2], owners[2:]), head, first) == kept


def test_frames_belong_to_the_messages_that_carry_their_placeholders():
    messages = [message("user", "<image>\na"), message("tool", "no frame"),
                message("user", "<image><image>\nb")]
    assert frame_owners(messages, 3, 10) == [10, 12, 12]
    assert frame_owners(messages, 1, 10) == [12]  # counts disagree: the group's last message


# ------------------------------------------------------------------ rendering


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir):
    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


@pytest.fixture(scope="module")
def image_tokenizer(smollm2_tokenizer_dir):
    """The SmolLM2 tokenizer with `<image>` as one token, as a LLaVA's has it."""
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    return tok


def tools() -> ToolBox:
    return ToolBox(load_tools(ROOT / "configs/calculator_tools.yaml"))


def test_a_window_is_rendered_fresh_with_the_tool_schemas(tokenizer):
    deltas = ChatDeltas(tokenizer, tools().schemas)
    messages = deltas.prepare(task_record(0)["messages"])  # the tool preamble in the system
    head = len(messages)
    for k in range(3):
        messages += [message("assistant", f"reply {k}"), message("tool", f"result {k}")]
    window = render_window(deltas, messages, [], head, 1, "test")
    picked = messages[:head] + messages[-2:]
    assert window.ids == tokenizer.encode(tokenizer.apply_chat_template(
        picked, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
    text = tokenizer.decode(window.ids)
    assert "<tools>" in text and "reply 2" in text and "result 2" in text
    assert "reply 1" not in text and "result 1" not in text
    assert (window.frames, window.starts) == ([], [])


def test_a_window_holds_the_frames_of_its_messages_at_their_placeholders(image_tokenizer):
    image_id = image_tokenizer.convert_tokens_to_ids("<image>")
    deltas = ChatDeltas(image_tokenizer, image_token=(image_id, WIDTH))
    messages = [message("system"), message("user", "<image>\nfirst view")]
    for k in range(3):
        messages += [message("assistant", f"ACTION: {k}"), message("user", f"<image>\nview {k}")]
    owners = frame_owners(messages, 4, 0)
    assert owners == [1, 3, 5, 7]
    window = render_window(deltas, messages, owners, 2, 2, "test")
    assert window.frames == [0, 2, 3]  # the task's frame and the last two turns'
    assert len(window.starts) == 3
    for start in window.starts:
        assert window.ids[start:start + WIDTH] == [image_id] * WIDTH
    assert window.ids.count(image_id) == 3 * WIDTH


# ------------------------------------------------------------------ the rollout


class CountingEngine:
    """Replies from a script by how many replies its episode has had (a window's prompt does
    not show them all); keeps every prompt and frame list it was given."""

    def __init__(self, tokenizer, script: dict[str, list[str]], image_id: int | None = None):
        self.tokenizer, self.script = tokenizer, script
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.replies: dict[str, int] = {}
        self.given: list[tuple[list[int], list]] = []
        if image_id is not None:
            self.vision = SimpleNamespace(placeholder=(image_id, WIDTH))

    def generate(self, prompt_ids, sampling, images=None):
        out = []
        for i, ids in enumerate(prompt_ids):
            key = next(k for k in self.script if k in self.tokenizer.decode(ids))
            k = self.replies.get(key, 0)
            self.replies[key] = k + 1
            self.given.append((list(ids), list(images[i]) if images else []))
            text = self.script[key][min(k, len(self.script[key]) - 1)]
            tokens = self.tokenizer.encode(text, add_special_tokens=False) + [self.im_end]
            out.append(Completion(tokens, [-0.5] * len(tokens), "stop"))
        return out


def call(expression: str) -> str:
    return ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'
            % expression)


EXPRESSIONS = [f"{10 + j} * 7" for j in range(1, 8)]


def tool_episode(tokenizer, context: str, turns: int = 2, max_tokens: int = 4000, seeds=(0,),
                 max_assistant_turns: int = 10):
    """Seven calculator calls, then the answer, for each seed's problem."""
    script = {make_problem(s).question: [call(e) for e in EXPRESSIONS]
              + [f"ANSWER: {make_problem(s).answer}"] for s in seeds}
    engine = CountingEngine(tokenizer, script)
    settings = conversation_settings(tools=tools(),
                                     history_turns=turns if context == "window" else None,
                                     max_assistant_turns=max_assistant_turns, max_tokens=max_tokens)
    records = conversation_rollout(engine, tokenizer, sampling_settings(max_new_tokens=64, seed=0),
                               [task_record(s) for s in seeds], settings)
    return engine, records


def test_the_engine_is_given_each_replys_window_and_the_episode_is_kept_whole(tokenizer):
    engine, [rec] = tool_episode(tokenizer, "window", turns=2)
    _, [whole] = tool_episode(tokenizer, "episode")
    # the conversation, its tokens and its check are what the whole-episode context keeps
    assert rec["input_ids"] == whole["input_ids"] and rec["messages"] == whole["messages"]
    assert rec["tokenization_check"] == "identical" and rec["termination"] == "done"
    assert rec["reply_steps"] == list(range(8))
    given = [ids for ids, _ in engine.given]
    assert given == rec["window_prompts"]
    assert given[0] == rec["input_ids"][:rec["segment_starts"][0]]  # the task alone, as packed
    for k, ids in enumerate(given):
        text = tokenizer.decode(ids)
        shown = [j for j, e in enumerate(EXPRESSIONS) if f'"{e}"' in text]
        assert shown == [j for j in (k - 2, k - 1) if 0 <= j < len(EXPRESSIONS)], k
        assert make_problem(0).question in text
    assert max(map(len, given)) < len(rec["input_ids"][:rec["segment_starts"][-1]])


def test_the_token_budget_bounds_each_window_and_reply_not_the_episode(tokenizer):
    budget = 450
    _, [whole] = tool_episode(tokenizer, "episode", max_tokens=budget)
    assert whole["termination"] == "token_budget"
    _, [rec] = tool_episode(tokenizer, "window", max_tokens=budget)
    assert rec["termination"] == "done" and len(rec["input_ids"]) > budget
    closing = len(ChatDeltas(tokenizer).closing_ids)
    for prompt, start, end in zip(rec["window_prompts"], rec["segment_starts"],
                                  rec["segment_ends"]):
        assert len(prompt) + (end - start) + closing <= budget


def test_an_episode_becomes_one_sample_per_reply_chained_by_slot_and_step(tokenizer, tmp_path):
    _, records = tool_episode(tokenizer, "window", seeds=(0, 1), max_assistant_turns=5)
    for r in records:
        r.update(run_id="t", iteration=0, episode_id=f"ep{r['episode_seed']}")
    samples = samples_from_episodes(records)
    assert len(samples) == sum(len(r["segment_starts"]) for r in records) == 10
    for slot, rec in enumerate(records):
        mine = [s for s in samples if s["episode_id"] == rec["episode_id"]]
        assert [s["env_index"] for s in mine] == [slot] * 5
        assert [s["replies"][0]["step"] for s in mine] == [0, 1, 2, 3, 4]
        for k, (s, start, end) in enumerate(zip(mine, rec["segment_starts"],
                                                rec["segment_ends"])):
            assert s["prompt_ids"] == rec["window_prompts"][k]
            assert s["response_ids"] == rec["input_ids"][start:end]
            assert s["loss_mask"] == [1] * (end - start)
            [reply] = s["replies"]
            assert (reply["start"], reply["end"], reply["turn"]) == (0, end - start, k)
            # GiGPO's anchor: what the model saw since its previous reply, as in a packed sample
            assert reply["observation"] == sample_from_episode(rec)["replies"][k]["observation"]
        *before, last = mine
        assert all(s["messages"] is None and not s["replies"][0]["truncated"] for s in before)
        # cut by max_assistant_turns: the last reply is truncated and bootstraps from the window
        # the next reply would have seen (its own call and the tool result dropped by the cut)
        assert last["replies"][0]["truncated"] and last["assistant_turns"] == 5
        assert last["bootstrap_prompt_ids"] == rec["bootstrap_prompt_ids"]
        text = tokenizer.decode(last["bootstrap_prompt_ids"])
        assert f'"{EXPRESSIONS[4]}"' in text and f'"{EXPRESSIONS[2]}"' not in text
    write_samples(samples, tmp_path / "part.parquet")  # the replies tile the loss tokens
    windowed = sample_metrics(samples)
    packed = sample_metrics([sample_from_episode(r) for r in records])
    for key in ("episodes_ended", "successes", "episode_length", "tool_calls_per_episode",
                "valid_action_ratio", "termination/max_assistant_turns",
                "tokenization/identical"):
        assert windowed[key] == packed[key], key
    assert windowed["mean_tokens"] > packed["mean_tokens"]  # windows re-read the task each reply


def test_a_window_of_no_turns_is_refused_by_name():
    params = Params()
    with pytest.raises(SettingError, match="prompt.history_turns 0"):
        ConversationSettings.from_config(params.rollout.chat, history_turns=0, tools=None,
                                         interaction=None, reward_fn=None, progress=False,
                                         action_prompt=None)
    assert params.rollout.context == "window"  # the default: Verlog's history window
    assert parse_params({"rollout": {"context": "episode"}}).rollout.context == "episode"


# ------------------------------------------------------------------ frames


def frames_episode(image_tokenizer, **limits):
    """BabyAI goto with frames through the chat protocol, a window of 1 turn: (its engine, the
    image token's id, the task record, the settings with `limits`)."""
    image_id = image_tokenizer.convert_tokens_to_ids("<image>")
    engine = CountingEngine(image_tokenizer, {"": ["ACTION: turn left", "ACTION: turn right"]},
                            image_id=image_id)
    task = {**BABYAI_GOTO_FRAMES.record(5), "task": "babyai_goto_frames", "seed": 5}
    settings = conversation_settings(
        interaction=load_interactions(ROOT / "configs/env_interactions.yaml")["env"],
        history_turns=1, max_tokens=4000, **limits)
    return engine, image_id, task, settings


def test_frames_go_with_their_messages_into_each_window(image_tokenizer, tmp_path):
    engine, image_id, task, settings = frames_episode(image_tokenizer, max_assistant_turns=4,
                                                      max_user_turns=6)
    [rec] = conversation_rollout(engine, image_tokenizer, sampling_settings(seed=0), [task], settings)
    assert rec["termination"] == "max_assistant_turns" and len(rec["images"]) == 4
    assert rec["window_frames"] == [[0], [0, 1], [0, 2], [0, 3]]  # the task's and the last turn's
    rec.update(run_id="t", iteration=0, episode_id="frames")
    samples = samples_from_episodes([rec])
    for k, (sample, (ids, frames)) in enumerate(zip(samples, engine.given)):
        assert sample["images"] == [rec["images"][j] for j in rec["window_frames"][k]]
        assert [start for start, _ in frames] == sample["image_starts"]
        for (start, frame), png in zip(frames, sample["images"]):
            np.testing.assert_array_equal(frame, from_png(png))
            assert ids[start:start + WIDTH] == [image_id] * WIDTH
    last = samples[-1]
    boot = sample_frames(last, "bootstrap_")  # what scoring gives the critic with the prompt
    # the last turn is the last reply alone: the observation after it was not appended
    assert last["bootstrap_images"] == [rec["images"][0]]
    for start, _ in boot:
        assert last["bootstrap_prompt_ids"][start:start + WIDTH] == [image_id] * WIDTH
    write_samples(samples, tmp_path / "frames.parquet")


def test_a_part_of_a_running_episode_gives_what_its_whole_record_gives(image_tokenizer):
    """A fixed-turn batch hands on a running episode's replies from the first not yet handed on
    (`Conversation.record(first)`): token lists from the reply before, only the frames its
    windows show, no episode totals, so a part of reply 10,000 costs what one of reply 10 does.
    Its samples must be exactly those the whole record gives for the same replies."""
    engine, _, task, settings = frames_episode(image_tokenizer, max_assistant_turns=50,
                                               max_user_turns=50)
    [ep], _ = start_episodes(chat_deltas(engine, image_tokenizer, settings), [task], ["part"],
                             settings)
    try:
        for step in range(7):
            lock_step(engine, [ep], settings, sampling_settings(seed=0), step)
        assert not ep.done and len(ep.segments) == 7 and len(ep.images) == 8

        def samples(first: int) -> list[dict]:
            record = ep.record(first, totals=first == 0)
            record.update(run_id="t", iteration=0, first_turn=first, cut=True)
            return samples_from_window(record, 3)

        whole = samples(0)
        for first in (1, 4, 6):
            part = ep.record(first, totals=False)
            assert part["input_ids"] == ep.ids[ep.segments[first - 1][1]:].tolist()
            # the task's frame and those of the turns its windows and bootstrap show
            assert len(part["images"]) == 1 + 8 - first and part["messages"] is None
            assert samples(first) == [{**w, **dict.fromkeys(
                ("messages", "metrics", "tokenization_check", "tool_calls", "tool_errors",
                 "user_turns", "assistant_turns"))} for w in whole[first:]]
        ep.let_go(4)  # handed on: their windows are not kept, nor frames no later one shows
        assert ep.windows[:4] == [None] * 4 and None not in ep.windows[4:]
        assert [j for j, frame in enumerate(ep.images) if frame is None] == [1, 2, 3]
        assert [(s["images"], s["bootstrap_images"]) for s in samples(4)] == \
            [(s["images"], s["bootstrap_images"]) for s in whole[4:]]
        ep.let_go(7)  # every reply handed on: the next window's frames alone are kept
        assert [j for j, frame in enumerate(ep.images) if frame is None] == [1, 2, 3, 4, 5, 6]
        assert all(frame is not None for _, frame in ep.given()[1])
    finally:
        release_all([ep], settings)


# ------------------------------------------------------------------ scoring


@pytest.fixture(scope="module")
def models(tiny_model_dir) -> ModelSet:
    torch.manual_seed(5)
    actor = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ref = copy.deepcopy(actor)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return ModelSet(actor, ref, random_head_critic(tiny_model_dir, 0.5).eval())


def scoring(kl_beta: float = 0.05) -> SimpleNamespace:
    return SimpleNamespace(temperature=1.0, kl_beta=kl_beta, kl_estimator="k1", mini_batch_size=4,
                           bf16=False, share_prefix=False)


def test_window_samples_score_as_one_chain_bootstrapped_by_the_critic(tokenizer, models):
    _, records = tool_episode(tokenizer, "window", max_assistant_turns=4)
    records[0].update(run_id="t", iteration=0, episode_id="ep")
    samples = score_samples(samples_from_episodes(records), models, scoring(), GAE, None,
                            tokenizer.pad_token_id)
    values = [s["values"] for s in samples]
    with torch.no_grad():  # the critic's own value of the window a next reply would see
        boot = float(state_values(models.critic, [samples[-1]["bootstrap_prompt_ids"]],
                                  tokenizer.pad_token_id)[0])
    expected_next = [v[0] for v in values[1:]] + [boot]
    assert [s["replies"][0]["next_value"] for s in samples] == pytest.approx(expected_next,
                                                                             abs=1e-5)
    adv, ret = reference_gae(np.concatenate(values), np.concatenate([s["token_rewards"]
                                                                     for s in samples]),
                             [len(v) for v in values], expected_next, [1, 1, 1, 0], GAE)
    np.testing.assert_allclose(np.concatenate([s["advantages"] for s in samples]), adv,
                               atol=1e-4)
    np.testing.assert_allclose(np.concatenate([s["returns"] for s in samples]), ret, atol=1e-4)
    assert all(np.isfinite(s["advantages"]).all() for s in samples)
    json.dumps([s["replies"] for s in samples])  # plain values, as written


@pytest.mark.parametrize("estimator", ["grpo", "gigpo"])
def test_group_estimators_give_a_reply_the_same_advantage_in_either_context(tokenizer, models,
                                                                            estimator):
    """Without KL the token rewards are the replies' rewards in both contexts, and GiGPO's anchor
    states are the same text: a window's sample per reply gets the advantage and return its reply
    gets inside the whole episode's packed sample."""
    seeds = (0, 1, 2, 3)
    script = {make_problem(s).question: [call(e) for e in EXPRESSIONS[:s % 3]]
              + [f"ANSWER: {make_problem(s).answer + s % 2}"] for s in seeds}  # odd seeds wrong
    settings = conversation_settings(tools=tools(), history_turns=1,
                                 reward_fn=TASK.reward, max_tokens=4000)
    records = conversation_rollout(CountingEngine(tokenizer, script), tokenizer,
                               sampling_settings(max_new_tokens=64, seed=0),
                               [task_record(s) for s in seeds], settings)
    for seed, r in zip(seeds, records):
        r.update(run_id="t", iteration=0, episode_id=f"ep{seed}", group_id=f"g{seed // 2}")
    assert [r["reward"] for r in records] == [1.0, 0.0, 1.0, 0.0]
    group = GroupParams(estimator, gamma_step=0.9, norm_std=True, step_weight=0.5)
    windows = score_samples(samples_from_episodes(records), models, scoring(0.0), None, group,
                            tokenizer.pad_token_id)
    packed = score_samples([sample_from_episode(r) for r in records], models, scoring(0.0), None,
                           group, tokenizer.pad_token_id)
    spans = [(p, reply) for p in packed for reply in p["replies"]]
    assert len(windows) == len(spans) == 1 + 2 + 3 + 1
    for sample, (whole, reply) in zip(windows, spans):
        for column in ("advantages", "returns"):
            np.testing.assert_allclose(sample[column],
                                       whole[column][reply["start"]:reply["end"]], atol=1e-6)
    assert any(np.abs(s["advantages"]).max() > 0 for s in windows)
