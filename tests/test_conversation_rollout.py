"""The built-in conversation rollout: tool calls (good and malformed), the revision interaction,
every termination rule, the loss mask decoded, and the real engine on a tiny random model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from longturn.engines.base import Completion
from longturn.engines.hf import HFEngine
from longturn.tasks.interactions import load_interactions
from longturn.rollout.conversation_rollout import ConversationSettings, conversation_rollout
from longturn.rollout.conversation import replies_valid
from longturn.rollout.samples import sample_from_episode, samples_from_episodes
from longturn.tasks.tools import ToolBox, load_tools
from longturn.tasks.arithmetic import make_problem, task_record
from settings_from_params import sampling_settings, conversation_settings

ROOT = Path(__file__).resolve().parents[1]


class ScriptedEngine:
    """Replies from a script keyed by (question, assistant turns so far): the rollout logic is
    tested on replies chosen to hit each branch, through real token ids."""

    def __init__(self, tokenizer, script: dict[str, list[str]]):
        self.tokenizer, self.script = tokenizer, script
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompt_ids, sampling):
        out = []
        for ids in prompt_ids:
            text = self.tokenizer.decode(ids)
            question = next(q for q in self.script if q in text)
            turn = text.count("<|im_start|>assistant") - 1
            replies = self.script[question]
            reply = replies[min(turn, len(replies) - 1)]
            tokens = self.tokenizer.encode(reply, add_special_tokens=False)[
                :sampling.max_new_tokens - 1] + [self.im_end]
            out.append(Completion(tokens, [-0.5] * len(tokens), "stop"))
        return out

    def update_weights(self, model_dir):
        pass

    def close(self):
        pass


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir):
    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


def settings(**kw) -> ConversationSettings:
    base = dict(tools=ToolBox(load_tools(ROOT / "configs/calculator_tools.yaml")),
                interaction=load_interactions(ROOT / "configs/revision_interactions.yaml")["revise"],
                max_assistant_turns=4, max_user_turns=1, max_tokens=2048, progress=False)
    base.update(kw)
    return conversation_settings(**base)


def call(expression: str) -> str:
    return ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'
            % expression)


def run(tokenizer, script_by_seed: dict[int, list[str]], max_new_tokens: int = 64, **kw):
    tasks = [task_record(seed) for seed in script_by_seed]
    script = {make_problem(seed).question: replies for seed, replies in script_by_seed.items()}
    sampling = sampling_settings(max_new_tokens=max_new_tokens, temperature=1.0, seed=0)
    return conversation_rollout(ScriptedEngine(tokenizer, script), tokenizer, sampling, tasks,
                            settings(**kw))


def trained_text(tokenizer, record) -> str:
    return tokenizer.decode([t for t, m in zip(record["input_ids"], record["loss_mask"]) if m])


def test_tool_call_then_right_answer(tokenizer):
    p = make_problem(0)
    replies = [call(p.expression), f"So the result is {p.answer}.\nANSWER: {p.answer}"]
    [rec] = run(tokenizer, {0: replies})
    assert (rec["termination"], rec["truncated"], rec["reward"]) == ("done", False, 1.0)
    assert (rec["assistant_turns"], rec["tool_calls"], rec["tool_errors"]) == (2, 1, 0)
    assert rec["reply_valid"] == [True, True]
    assert rec["tokenization_check"] == "identical"
    messages = json.loads(rec["messages"])
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[3]["content"] == str(p.answer)
    # the loss mask covers exactly the sampled replies, end-of-turn tokens included
    assert trained_text(tokenizer, rec) == "<|im_end|>".join(replies) + "<|im_end|>"
    assert rec["segment_rewards"] == [0.0, 1.0]
    for start, end in zip(rec["segment_starts"], rec["segment_ends"]):
        assert set(rec["loss_mask"][start:end]) == {1}
        assert rec["engine_logprobs"][start:end] == [-0.5] * (end - start)
    assert sum(rec["loss_mask"]) == sum(e - s for s, e in zip(rec["segment_starts"],
                                                              rec["segment_ends"]))


def test_malformed_tool_call_gives_an_error_result_and_the_episode_goes_on(tokenizer):
    p = make_problem(1)
    bad = '<tool_call>\n{"name": "calculator", "arguments": {"expression": }\n</tool_call>'
    [rec] = run(tokenizer, {1: [bad, call("2 ** 1000"), f"ANSWER: {p.answer}"]})
    messages = json.loads(rec["messages"])
    assert messages[3]["role"] == "tool" and "not valid JSON" in messages[3]["content"]
    assert "exponents above 64" in messages[5]["content"]
    # both calls failed, by one rule: the malformed one, and the one the calculator refused
    # (its own `Error:` result); a reply with a failed call is invalid, and its messages say so
    assert (rec["termination"], rec["reward"], rec["tool_errors"]) == ("done", 1.0, 2)
    assert rec["tokenization_check"] == "identical"
    assert rec["reply_valid"] == [False, False, True] == replies_valid(messages, 3)
    [sample] = samples_from_episodes([rec])
    assert [r["action_valid"] for r in sample["replies"]] == [False, False, True]


def test_probe_tool_calls_are_error_messages_and_the_episode_goes_on(tokenizer):
    # the probes that ended runs: JSON nested 1,000 deep (RecursionError) and a 5,000-digit
    # integer (ValueError), each the whole reply, uncut
    p = make_problem(1)
    deep = '<tool_call>\n{"name": "calculator", "arguments": %s}\n</tool_call>' % (
        "[" * 1000 + "]" * 1000)
    digits = call("1").replace('"1"', "9" * 5000)
    [rec] = run(tokenizer, {1: [deep, digits, f"ANSWER: {p.answer}"]}, max_new_tokens=6000,
                max_tokens=16_384)
    messages = json.loads(rec["messages"])
    assert messages[2]["content"] == deep and messages[4]["content"] == digits
    assert messages[3] == {"role": "tool", "name": "error", "content": "Error: the tool call "
                           "nests objects and arrays 1,001 deep; the limit is 64"}
    assert messages[5]["content"] == ("Error: a number in the tool call has 5,000 digits; the "
                                      "limit is 100")
    assert (rec["termination"], rec["reward"], rec["tool_calls"], rec["tool_errors"]) == (
        "done", 1.0, 2, 2)


def test_a_raising_parser_or_tool_box_is_an_error_message(tokenizer, monkeypatch):
    # last guards in the rollout: whatever parsing or running a call raises is the model's to read
    p = make_problem(1)

    def parser_bug(text):  # breaks on the reply with a call, as a parser bug would
        if "<tool_call>" in text:
            raise RecursionError("maximum recursion depth exceeded")
        return []

    monkeypatch.setattr("longturn.rollout.conversation_rollout.parse_tool_calls", parser_bug)
    [rec] = run(tokenizer, {1: [call("1+1"), f"ANSWER: {p.answer}"]})
    messages = json.loads(rec["messages"])
    assert messages[3]["content"] == "Error: the tool calls could not be read (RecursionError)"
    assert (rec["termination"], rec["reward"], rec["tool_errors"]) == ("done", 1.0, 1)

    async def box_bug(self, instance_id, call, timeout_s):
        raise MemoryError("the box broke\nsecond line")

    monkeypatch.undo()
    monkeypatch.setattr(ToolBox, "run", box_bug)
    [rec] = run(tokenizer, {1: [call("1+1"), f"ANSWER: {p.answer}"]})
    messages = json.loads(rec["messages"])
    assert messages[3] == {"role": "tool", "name": "calculator", "content": "Error: the tool call "
                           "failed: MemoryError: the box broke"}
    assert (rec["termination"], rec["reward"], rec["tool_errors"]) == ("done", 1.0, 1)


def test_wrong_answer_gets_one_revision_then_ends(tokenizer):
    [rec] = run(tokenizer, {2: ["ANSWER: -1", "ANSWER: -2"]})
    messages = json.loads(rec["messages"])
    assert messages[3] == {"role": "user", "content": "That answer is not right. Check the "
                           "computation and answer again."}
    assert (rec["termination"], rec["reward"], rec["user_turns"]) == ("done", 0.0, 1)


def test_max_user_turns_ends_a_conversation_the_user_would_continue(tokenizer):
    interaction = load_interactions(ROOT / "configs/revision_interactions.yaml")["revise"]
    interaction.config["max_revisions"] = 5
    [rec] = run(tokenizer, {2: ["no idea"]}, interaction=interaction, max_user_turns=2)
    assert (rec["termination"], rec["truncated"], rec["user_turns"]) == (
        "max_user_turns", True, 2)


def test_max_assistant_turns_and_token_budget(tokenizer):
    [rec] = run(tokenizer, {3: [call("1+1")]}, max_assistant_turns=3)
    assert (rec["termination"], rec["assistant_turns"], rec["tool_calls"]) == (
        "max_assistant_turns", 3, 3)
    assert rec["tokenization_check"] == "identical"
    [first] = run(tokenizer, {3: [call("1+1")]})
    budget = first["segment_ends"][0] + 20  # room for one reply and part of the tool result
    [rec] = run(tokenizer, {3: [call("1+1")]}, max_tokens=budget)
    assert rec["termination"] == "token_budget" and len(rec["input_ids"]) <= budget
    assert rec["tokenization_check"] == "identical"


def test_batch_mixes_episodes_that_end_at_different_turns(tokenizer):
    p0, p4 = make_problem(0), make_problem(4)
    recs = run(tokenizer, {0: [f"ANSWER: {p0.answer}"],
                           4: [call(p4.expression), call("1"), f"ANSWER: {p4.answer}"]})
    assert [r["assistant_turns"] for r in recs] == [1, 3]
    assert [r["reward"] for r in recs] == [1.0, 1.0]


def test_real_engine_tiny_model_passes_the_strict_check(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = HFEngine(tiny_model_dir, dtype="float32")
    tasks = [task_record(s) for s in range(3)]
    sampling = sampling_settings(max_new_tokens=12, temperature=1.0, seed=5)
    recs = conversation_rollout(engine, tok, sampling, tasks, settings(max_assistant_turns=2))
    for rec in recs:
        assert rec["tokenization_check"] in ("identical", "same_text")
        assert rec["termination"] in ("done", "max_assistant_turns", "max_user_turns")
        assert len(rec["engine_logprobs"]) == len(rec["input_ids"]) == len(rec["loss_mask"])
        assert all(lp < 0 for lp, m in zip(rec["engine_logprobs"], rec["loss_mask"]) if m)
    again = conversation_rollout(engine, tok, sampling, tasks, settings(max_assistant_turns=2))
    assert [r["input_ids"] for r in again] == [r["input_ids"] for r in recs]  # seeded


def test_parquet_round_trip_loss_mask_decodes_to_the_replies(tokenizer, tmp_path):
    from longturn.algo.gae import GAEParams
    from longturn.algo.reply_chains import ADVANTAGE_INPUTS, sample_advantages
    from longturn.rollout.samples import samples_from_episodes
    from longturn.trajectories import read_metadata, read_table, write_samples

    p = make_problem(5)
    replies = [call(p.expression), "no tag here", f"ANSWER: {p.answer}"]
    records = run(tokenizer, {5: replies, 6: ["ANSWER: 0", "ANSWER: 1"]})
    samples = samples_from_episodes(dict(r, iteration=0, run_id="t") for r in records)
    path = write_samples(samples, tmp_path / "part-00.parquet", {"algo": "gae"})
    assert read_metadata(path)["schema_version"] == "2"
    table = read_table(path).to_pylist()
    first = table[0]
    # one packed sample: the context before the first reply, then everything after it
    assert first["prompt_ids"] + first["response_ids"] == records[0]["input_ids"]
    assert first["env_index"] is None and len(first["replies"]) == 3
    assert len(first["response_ids"]) == len(first["loss_mask"]) == len(first["engine_logprobs"])
    sampled = [t for t, m in zip(first["response_ids"], first["loss_mask"]) if m]
    assert tokenizer.decode(sampled) == "<|im_end|>".join(replies) + "<|im_end|>"
    context = tokenizer.decode([t for t, m in zip(first["response_ids"], first["loss_mask"])
                                if not m])
    assert "<|im_start|>tool" in context and "<|im_start|>user" in context
    assert table[1]["replies"][-1]["termination"] == "done" and table[1]["user_turns"] == 1
    # GAE over the row's own columns: the final reward reaches every model token, nothing else
    n = len(first["response_ids"])
    rewards = [0.0] * n
    for reply, r in zip(first["replies"], records[0]["segment_rewards"]):
        assert reply["reward"] == r
        rewards[reply["end"] - 1] += r
    columns = {k: [first[k]] for k in ADVANTAGE_INPUTS}
    columns.update(values=[[0.0] * n], token_rewards=[rewards])
    [adv], _ = sample_advantages(columns, GAEParams(gamma_step=1.0, lambda_step=1.0), None)
    assert [a for a, m in zip(adv.tolist(), first["loss_mask"]) if m] == \
        [1.0] * sum(first["loss_mask"])
    assert all(a == 0 for a, m in zip(adv.tolist(), first["loss_mask"]) if not m)


def test_a_prompt_longer_than_the_budget_ends_before_any_reply(tokenizer):
    [rec] = run(tokenizer, {7: ["ANSWER: 1"]}, max_tokens=20)
    assert (rec["termination"], rec["assistant_turns"], sum(rec["loss_mask"])) == (
        "token_budget", 0, 0)
    assert rec["tokenization_check"] == "identical"  # the first messages with the prompt


def test_each_reply_says_why_it_stopped_and_a_reply_cut_to_the_budget_reads_length(tokenizer):
    """The engine's finish_reason reaches every reply of the samples (docs/design.md §4)."""
    p = make_problem(0)
    [rec] = run(tokenizer, {0: [call(p.expression), f"ANSWER: {p.answer}"]})
    assert rec["reply_finish_reasons"] == ["stop", "stop"]
    assert [r["finish_reason"] for r in sample_from_episode(rec)["replies"]] == ["stop", "stop"]
    [first] = run(tokenizer, {3: [call("1+1")]})
    room = first["segment_starts"][0] + 5  # the reply does not fit: cut to 5 - closing tokens
    [cut] = run(tokenizer, {3: [call("1+1")]}, max_tokens=room)
    assert cut["termination"] == "token_budget" and cut["reply_finish_reasons"] == ["length"]
