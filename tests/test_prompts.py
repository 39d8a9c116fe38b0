"""Prompt assembly: structure, history window, token budget (never a silent cut)."""

import pytest

from env_conversations import one_slot_batch
from longturn.agent.memory import HistoryEntry, PastTurn
from longturn.agent.prompts import PromptTooLong, build_messages, build_prompt, history_reply
from longturn.envs.babyai import BabyAITextEnv
from longturn.envs.registry import translator_for
from longturn.params.config import parse_params
from longturn.run.models import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir):
    return load_tokenizer(smollm2_tokenizer_dir)


@pytest.fixture(scope="module")
def env():
    env = BabyAITextEnv("goto")
    env.reset(seed=3)
    return env


def test_messages_structure(env):
    past = [PastTurn(f"obs {i}", f"THINK: t{i}\nACTION: go forward", "go forward", True)
            for i in range(3)]
    msgs = build_messages(env.instructions, [HistoryEntry(t.observation, t.reply)
                                           for t in past[-2:]], "a wall 1 step forward")
    roles = [m["role"] for m in msgs]
    demos = len(env.instructions.demonstrations)
    assert demos >= 1
    assert roles == ["system"] + ["user", "assistant"] * (demos + 2) + ["user"]
    assert "turn left: turn to the left" in msgs[0]["content"]
    assert "Tips:" in msgs[0]["content"]
    for (goal, observation, reply), user, assistant in zip(
            env.instructions.demonstrations, msgs[1::2], msgs[2::2]):
        assert goal in user["content"] and observation in user["content"]
        assert "Answer in exactly this format" in user["content"]  # shown as a real turn
        assert assistant["content"] == reply
    assert msgs[1 + 2 * demos]["content"] == "Observation:\nobs 1"  # the window kept the last two
    last = msgs[-1]["content"]
    assert env.instructions.goal in last and "a wall 1 step forward" in last
    assert "THINK:" in last and "ACTION:" in last
    assert len(build_messages(env.instructions, [], "x", demonstration=False)) == 2


def test_system_prompt_and_demo_are_a_shared_prefix(tokenizer):
    a, b = BabyAITextEnv("goto"), BabyAITextEnv("pickup")
    a.reset(seed=1)
    b.reset(seed=2)
    pa = build_prompt(tokenizer, a.instructions, [], "a wall 1 step left", 1024)
    pb = build_prompt(tokenizer, b.instructions, [], "a red key 2 steps forward", 1024)
    common = next(i for i, (x, y) in enumerate(zip(pa.ids, pb.ids)) if x != y)
    assert common > 0.6 * len(pa.ids)


def test_budget_drops_oldest_history_first(tokenizer, env):
    history = [HistoryEntry("a wall 2 steps left\n" * 10, "ACTION: turn left " + "x " * 40)
               for _ in range(3)]
    full = build_prompt(tokenizer, env.instructions, history, "now", 4096)
    assert full.history_used == 3 and full.history_dropped == 0
    tight = build_prompt(tokenizer, env.instructions, history, "now", len(full.ids) - 1)
    assert tight.history_dropped >= 1 and tight.history_used == 3 - tight.history_dropped
    assert len(tight.ids) <= len(full.ids) - 1
    assert tight.text.endswith("<|im_start|>assistant\n")  # the tail is never cut


def test_current_turn_too_long_is_an_error(tokenizer, env):
    with pytest.raises(PromptTooLong, match="max_prompt_tokens=50"):
        build_prompt(tokenizer, env.instructions, [], "a wall 1 step left", 50)


def test_history_reply_modes():
    out = "THINK: hmm\nACTION: go forwad"
    assert history_reply(out, "go forward", False, "output", "default_action") == "ACTION: go forward"
    assert history_reply(out, "go forward", False, "output", "raw_output") == out
    assert history_reply(out, "turn left", True, "action", "default_action") == "ACTION: turn left"
    assert history_reply(out, "turn left", True, "output", "default_action") == out


def test_babyai_demonstrations_parse_and_show_turning():
    """The worked exchanges are valid replies, and they show turning as well as going forward:
    with a go-forward example alone, SmolLM2-135M turned on 4% of turns and rarely reached a goal."""
    env = BabyAITextEnv("goto")
    translator = translator_for(env)
    parsed = [translator.parse(reply) for _, _, reply in env.instructions.demonstrations]
    assert all(p.valid and p.n_action_tags == 1 for p in parsed)
    assert {"turn left", "turn right", "go forward"} <= {p.action for p in parsed}


def test_the_whole_episode_as_context_keeps_every_past_turn(tokenizer):
    """`rollout.context: episode` with the action protocol: the prompt of turn 6 still shows the
    first observation (a window of 1 turn has dropped it), as far as max_prompt_tokens holds."""
    prompts = {}
    for context in ("episode", "window"):
        params = parse_params({
            "rollout": {"context": context},
            "prompt": {"max_prompt_tokens": 4096, "history_turns": 1},
            "env": {"tasks": ["goto"], "kwargs": {"num_dists": 0}, "max_turns": None,
                    "workers": False, "step_timeout_s": None}})
        samples = one_slot_batch(params, tokenizer,
                                 lambda k: f"THINK: probe {k}.\nACTION: turn left", 6)
        assert [s["replies"][0]["turn"] for s in samples] == list(range(6))  # one episode
        prompts[context] = samples[-1]
    assert all(f"probe {turn}." in prompts["episode"]["prompt_text"] for turn in range(5))
    assert prompts["episode"]["replies"][0]["history_dropped"] == 0
    window = prompts["window"]["prompt_text"]
    assert "probe 4." in window and "probe 0." not in window
