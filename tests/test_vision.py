"""Image observations with a tiny random vision-language model built from a config: the split
into a causal LM and its image side matches the original LLaVA forward, the engine samples with
frames in view, a BabyAI episode buffers its frames per turn, and PPO trains on them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoTokenizer, LlavaForConditionalGeneration

from longturn.algo.sample_scoring import audit_samples_file
from longturn.audit.run_files import open_run
from longturn.audit.show import show_episode
from longturn.params.config import parse_params
from longturn.engines.hf import HFEngine
from longturn.engines.logprobs import token_logprobs
from longturn.errors import UserError
from longturn.run.models import prepare_base_model
from longturn.rollout.chat_deltas import ChatDeltas
from longturn.rollout.conversation_setup import ConversationRun
from longturn.run.training import run_training
from longturn.run.validation import validate_env_task
from longturn.vision.encoder import VISION_DIR, load_vision
from longturn.vision.frames import from_png, to_png
from longturn.vision.split import VisionModelError
from settings_from_params import sampling_settings
from test_training import paths
from vlm_fixtures import TOKENS_PER_IMAGE, build_tiny_llava

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def llava_dir(smollm2_tokenizer_dir, tmp_path_factory) -> Path:
    return build_tiny_llava(smollm2_tokenizer_dir, tmp_path_factory.mktemp("tiny_llava"))


@pytest.fixture(scope="module")
def vlm_dir(llava_dir, tmp_path_factory) -> str:
    """The tiny LLaVA as the base-model stage leaves it: causal LM + vision/."""
    return str(prepare_base_model(str(llava_dir), tmp_path_factory.mktemp("vlm") / "base"))


def frames(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (40, 48, 3), dtype=np.uint8) for _ in range(n)]


def prompt_with_images(tokenizer, n_images: int) -> tuple[list[int], list[int]]:
    """Chat-template ids of a user turn with `n_images` images, expanded; and their starts."""
    deltas = ChatDeltas(tokenizer, image_token=(tokenizer.convert_tokens_to_ids("<image>"),
                                                TOKENS_PER_IMAGE))
    text = " ".join(["<image>"] * n_images) + " What do you see?"
    ids = deltas.start([{"role": "user", "content": text}])
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    at = [i for i, t in enumerate(ids) if t == image_id]
    return ids, at[::TOKENS_PER_IMAGE]


def test_png_frames_round_trip():
    frame = frames(1)[0]
    assert np.array_equal(from_png(to_png(frame)), frame)
    with pytest.raises(ValueError, match="uint8"):
        to_png(frame.astype(np.float32))


def test_split_matches_the_llava_forward(llava_dir, vlm_dir):
    """LM + hooked features give the original LlavaForConditionalGeneration's logits."""
    assert (Path(vlm_dir) / VISION_DIR / "config.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(vlm_dir)
    ids, starts = prompt_with_images(tokenizer, 2)
    images = frames(2)
    llava = LlavaForConditionalGeneration.from_pretrained(llava_dir, dtype=torch.float32).eval()
    from transformers import AutoImageProcessor
    pixels = AutoImageProcessor.from_pretrained(llava_dir)(images=images, return_tensors="pt")
    with torch.no_grad():
        want = llava(input_ids=torch.tensor([ids]), pixel_values=pixels["pixel_values"]).logits
    engine = HFEngine(vlm_dir, dtype="float32")
    assert engine.vision.tokens_per_image == TOKENS_PER_IMAGE
    reply = engine.generate([ids], sampling_settings(max_new_tokens=6, seed=3),
                            images=[list(zip(starts, images))])[0]
    with torch.no_grad():
        full = llava(input_ids=torch.tensor([ids + reply.token_ids]),
                     pixel_values=pixels["pixel_values"]).logits[0]
    assert torch.allclose(full[:len(ids)], want[0], atol=1e-4)
    expected = token_logprobs(full[len(ids) - 1:-1], torch.tensor(reply.token_ids))
    assert np.allclose(reply.logprobs, expected.numpy(), atol=1e-4)
    # the frames matter: other frames give other logprobs for the same tokens
    other = llava(input_ids=torch.tensor([ids + reply.token_ids]),
                  pixel_values=AutoImageProcessor.from_pretrained(llava_dir)(
                      images=frames(2, seed=9), return_tensors="pt")["pixel_values"]).logits[0]
    moved = token_logprobs(other[len(ids) - 1:-1], torch.tensor(reply.token_ids))
    assert not torch.allclose(moved, expected, atol=1e-3)


def test_images_need_a_vision_model(tiny_model_dir, vlm_dir):
    tokenizer = AutoTokenizer.from_pretrained(vlm_dir)
    ids, starts = prompt_with_images(tokenizer, 1)
    engine = HFEngine(tiny_model_dir, dtype="float32")
    with pytest.raises(ValueError, match="no image side"):
        engine.generate([ids], sampling_settings(max_new_tokens=2),
                        images=[[(starts[0], frames(1)[0])]])
    run = ConversationRun.from_params(vision_params(tiny_model_dir), progress=False)
    with pytest.raises(UserError, match="no image side"):
        run.play(engine, engine.tokenizer, sampling_settings(max_new_tokens=4, seed=1),
                 [run.record("babyai_goto_frames", 3)], ["e0"])
    params = action_vision_params(tiny_model_dir)  # validation plays the first turn
    with pytest.raises(UserError, match="gives image observations but the model has no image"):
        validate_env_task(engine, engine.tokenizer, params, "goto", sampling_settings(), [3])


def test_prompt_validation_shows_the_model_each_first_observations_frame(vlm_dir):
    params = action_vision_params(vlm_dir)
    engine = HFEngine(vlm_dir, dtype="float32")
    result = validate_env_task(engine, engine.tokenizer, params, "goto",
                               sampling_settings(max_new_tokens=10, seed=1), [3, 4])
    assert [len(s["images"]) for s in result.samples] == [1, 1]
    assert result.metrics["samples"] == 2
    # the budget check counts the frame's feature positions: at least the first prompt's length
    assert result.metrics["worst_case_prompt_tokens"] >= len(result.samples[0]["prompt_ids"])
    assert result.metrics["prompt_tokens_max"] > TOKENS_PER_IMAGE


def vision_params(model_dir: str, iterations: int = 1, advantage: str = "gae"):
    return parse_params({
        "seed": 3,
        "model": {"source": model_dir, "dtype": "float32"},
        "env": {"name": "babyai", "tasks": ["babyai_goto_frames"], "workers": False,
                "step_timeout_s": None},
        "engine": {"batch_size": 4, "sampling": {"max_new_tokens": 10, "temperature": 1.0}},
        "rollout": {"protocol": "chat", "context": "episode", "n_envs": 2, "chat": {
            "interactions": str(ROOT / "configs/env_interactions.yaml"),
            "max_assistant_turns": 3, "max_user_turns": 3, "max_tokens": 1500}},
        "algo": {"advantage": advantage, "group_size": 2},
        "ppo": {"mini_batch_size": 2, "micro_batch_size": 1, "bf16": False, "lora": True,
                "actor_lr": 1e-2, "critic_lr": 1e-3},
        "train": {"iterations": iterations, "checkpoint_every": 1, "keep_checkpoints": 1},
    })


def test_babyai_episode_buffers_a_frame_per_observation(vlm_dir):
    run = ConversationRun.from_params(vision_params(vlm_dir), progress=False)
    engine = HFEngine(vlm_dir, dtype="float32")
    records = [run.record("babyai_goto_frames", s) for s in (3, 4)]
    out = run.play(engine, engine.tokenizer, sampling_settings(max_new_tokens=10, seed=1), records,
                   ["e0", "e1"])
    image_id = engine.vision.image_token_id
    for rec in out:
        ids, mask = rec["input_ids"], rec["loss_mask"]
        user_turns = [m for m in json.loads(rec["messages"]) if m["role"] == "user"]
        # one frame for the first observation and one per observation the env answered with
        assert len(rec["images"]) == len(user_turns) == len(rec["image_starts"])
        assert rec["tokenization_check"] in ("identical", "same_text")
        for start in rec["image_starts"]:
            span = ids[start:start + TOKENS_PER_IMAGE]
            assert span == [image_id] * TOKENS_PER_IMAGE
            assert not any(mask[start:start + TOKENS_PER_IMAGE])  # frames are context
        assert from_png(rec["images"][0]).shape == (112, 112, 3)  # BabyAI's 7×7 view, 16 px tiles
        assert rec["assistant_turns"] >= 1


@pytest.mark.parametrize("advantage", ["gae", "grpo"])
def test_ppo_trains_on_sequences_with_frames(tmp_path, vlm_dir, advantage):
    history = run_training(vision_params(vlm_dir, advantage=advantage), paths(tmp_path, vlm_dir),
                           progress=False)
    part = tmp_path / "trajectories" / "iteration=0000" / "part-00.parquet"
    frame = pd.read_parquet(part)
    assert len(frame) == 2
    for row in frame.itertuples():
        assert len(row.images) == len(row.image_starts) >= 1
        # the first frame is in the prompt (the first observation, before the first reply)
        assert row.image_starts[0] < len(row.prompt_ids)
        sampled = np.asarray(row.loss_mask, dtype=bool)
        assert sampled.any()
        # the trainer's forward saw the frames the engine saw: same logprobs (T = 1)
        assert np.allclose(row.old_logprobs[sampled], row.engine_logprobs[sampled], atol=1e-3)
    assert audit_samples_file(part) < 1e-4
    assert history[0]["n_tokens"] == sum(sum(m) for m in frame["loss_mask"])
    assert history[0]["images_per_episode"] == frame["images"].map(len).mean()
    # the audit writes an episode's frames back out as they were stored
    episode = frame["episode_id"].iloc[0]
    shown = show_episode(open_run(tmp_path / "trajectories"), episode,
                         frames_dir=str(tmp_path / "frames"))
    assert shown.data["images"] == len(frame["images"].iloc[0]) == len(shown.data["frames"])
    assert Path(shown.data["frames"][0]).read_bytes() == frame["images"].iloc[0][0]
    # the exported policy carries the same frozen image side
    vision = load_vision(tmp_path / "final")
    assert vision is not None and vision.tokens_per_image == TOKENS_PER_IMAGE


def action_vision_params(model_dir: str):
    """The action protocol (THINK/ACTION, a window of one turn) on BabyAI goto with
    its frames, fixed-turn batches with a critic."""
    return parse_params({
        "seed": 3,
        "model": {"source": model_dir, "dtype": "float32"},
        "env": {"name": "babyai", "tasks": ["goto"], "kwargs": {"num_dists": 0, "image": True},
                "workers": False, "step_timeout_s": None},
        "prompt": {"max_prompt_tokens": 1200},
        "engine": {"batch_size": 4, "sampling": {"max_new_tokens": 10, "temperature": 1.0}},
        "rollout": {"n_envs": 2, "turns_per_env": 2},
        "ppo": {"mini_batch_size": 2, "micro_batch_size": 1, "bf16": False, "lora": True,
                "actor_lr": 1e-2, "critic_lr": 1e-3},
        "train": {"iterations": 1, "checkpoint_every": 1, "keep_checkpoints": 1},
    })


def test_the_action_protocol_gives_each_prompt_its_observations_frame_and_trains_on_it(
        tmp_path, vlm_dir):
    run_training(action_vision_params(vlm_dir), paths(tmp_path, vlm_dir), progress=False)
    part = tmp_path / "trajectories" / "iteration=0000" / "part-00.parquet"
    frame = pd.read_parquet(part)
    image_id = AutoTokenizer.from_pretrained(vlm_dir).convert_tokens_to_ids("<image>")
    assert len(frame) == 4  # 2 slots × 2 lock-steps, a sample a reply
    for row in frame.itertuples():
        assert len(row.images) == len(row.image_starts) == 1  # the current observation's frame
        start = row.image_starts[0]
        assert list(row.prompt_ids[start:start + TOKENS_PER_IMAGE]) == [image_id] * TOKENS_PER_IMAGE
        assert list(row.prompt_ids).count(image_id) == TOKENS_PER_IMAGE  # past turns are text
        assert from_png(row.images[0]).shape == (112, 112, 3)
        sampled = np.asarray(row.loss_mask, dtype=bool)
        # the trainer's forward saw the frame the engine saw: same logprobs (T = 1)
        assert np.allclose(row.old_logprobs[sampled], row.engine_logprobs[sampled], atol=1e-3)
        if row.bootstrap_prompt_ids is not None:  # cut by the batch: valued with its next frame
            assert len(row.bootstrap_images) == len(row.bootstrap_image_starts) == 1
    assert frame["bootstrap_prompt_ids"].notna().any()
    assert audit_samples_file(part) < 1e-4


def test_unsupported_vision_layouts_are_refused(llava_dir, tmp_path):
    other = tmp_path / "qwen2_vl"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "qwen2_vl",
                                                   "vision_config": {"depth": 2}}))
    with pytest.raises(VisionModelError, match="'qwen2_vl'.*LLaVA layout"):
        prepare_base_model(str(other), tmp_path / "a")
    layers = tmp_path / "layers"
    shutil.copytree(llava_dir, layers)
    config = json.loads((layers / "config.json").read_text())
    (layers / "config.json").write_text(json.dumps({**config, "vision_feature_layer": [-2, -1]}))
    with pytest.raises(VisionModelError, match="vision_feature_layer"):
        prepare_base_model(str(layers), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
