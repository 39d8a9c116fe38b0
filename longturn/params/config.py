"""Typed parameters: one pydantic model per params.yaml section.

Stage scripts call `load_params(path)`; library code receives the validated models, never the file.
An unknown key, a wrong type or an impossible value raises `ParamsError` naming the dotted key, before
any work starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from longturn.params import limits as L
from longturn.errors import UserError
from longturn.params.estimator import ESTIMATORS, Collection, Estimator
from longturn.params.limits import at_most
from longturn.params.sizes import size_problem


class Section(BaseModel):
    """Base for every section: unknown keys are errors, values are checked on assignment too, and
    types are strict (`n_envs: true` is not 1, `lora: 1` is not true; an int is still a valid
    float)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, strict=True)


class ModelParams(Section):
    """Which weights to start from: the embedded SmolLM2 or a path to a Hugging Face directory."""

    source: str = "smollm2-135m-instruct"
    # generation dtype; auto: bfloat16 where the device computes it natively (GPUs, CPUs with
    # AVX512-BF16 / AMX), float32 elsewhere (bf16 is ~500x slower than fp32 on an AVX2-only CPU)
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"


class SamplingSection(Section):
    """Sampling for generation; RL needs the untruncated distribution (top_k 0, top_p 1)."""

    max_new_tokens: int = at_most(L.CONTEXT_TOKENS, 64, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = at_most(L.VOCABULARY, 0, ge=0)


class SGLangParams(Section):
    """The SGLang server behind `engine.name: sglang`: launched by each rank, or one already running.

    SGLang pins its own torch and transformers, so it lives in its own interpreter (`python`) and is
    spoken to over HTTP only. Rank r of a torchrun job serves on `port + r` from GPU
    `r × tp_size`, next to its trainer (`mem_fraction_static` leaves room for DeepSpeed)."""

    url: str | None = None             # an already running server: attach, never launch or stop it
    python: str = "python3"            # interpreter whose environment has sglang installed
    host: str = "127.0.0.1"
    port: int = Field(30000, ge=1, le=65535)
    tp_size: int = at_most(L.NODE_GPUS, 1, ge=1)
    mem_fraction_static: float | None = Field(None, gt=0.0, lt=1.0)
    extra_args: list[str] = Field(default_factory=list)  # more `sglang.launch_server` flags
    # Where each launched server writes its log (sglang-<port>-*.log, quoted in errors); None: the
    # system temp dir (TMPDIR). The log is evidence, so it is kept after the server stops.
    log_dir: str | None = None
    startup_timeout_s: float = Field(900.0, gt=0)
    request_timeout_s: float = Field(900.0, gt=0)


class EngineParams(Section):
    """Generation backend, looked up by name in the engine registry."""

    name: str = "hf"
    # auto: this rank's GPU (LOCAL_RANK) when CUDA is available, else the CPU. Every model-holding
    # part of a stage (inference engine, scoring, critic, DeepSpeed engines) uses this device.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    batch_size: int = at_most(L.BATCH_ROWS, 16, ge=1)
    # In-process engine on CUDA: replay each decode step as one captured CUDA graph (the loop is
    # launch-bound otherwise); falls back to eager steps, with a warning, where capture fails.
    cuda_graphs: bool = True
    sampling: SamplingSection = SamplingSection()
    sglang: SGLangParams = SGLangParams()


class EnvParams(Section):
    """Environment family, its tasks, the invalid-action rule, and how env failures are handled."""

    name: str = "babyai"
    tasks: list[str] = Field(default_factory=lambda: ["goto"], min_length=1)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    invalid_action_penalty: float = Field(0.1, ge=0.0)
    max_turns: int | None = at_most(L.EPISODE_TURNS, None, ge=1)
    # true: each env steps in its own worker process (a hung or crashing env is killed and
    # restarted, its episode aborted); false: in this process (a raise still aborts the episode,
    # a hang blocks the stage)
    workers: bool = True
    # seconds a reset or step may take in a worker before it is killed (null: no limit)
    step_timeout_s: float | None = Field(60.0, gt=0)
    # env failures in a row one slot survives; one more stops the stage naming env, task and seed
    max_retries: int = at_most(L.REPEATS, 3, ge=0)

    @model_validator(mode="after")
    def _timeout_needs_workers(self) -> "EnvParams":
        if not self.workers and self.step_timeout_s is not None:
            raise ValueError("env.step_timeout_s needs env.workers: true (a step in this process "
                             "cannot be interrupted); set env.step_timeout_s: null")
        return self


class PromptParams(Section):
    """How a turn's prompt is assembled from instructions, the history window and the observation."""

    history_turns: int = at_most(L.CONTEXT_TOKENS, 1, ge=0)
    history_content: Literal["output", "action"] = "output"
    invalid_in_history: Literal["default_action", "raw_output"] = "default_action"
    max_prompt_tokens: int = at_most(L.CONTEXT_TOKENS, 1024, ge=16)
    demonstration: bool = True  # show the env's worked example exchanges before the history

    @model_validator(mode="after")
    def _history_fits_the_prompt(self) -> "PromptParams":
        # every remembered turn takes a token of the prompt at least; the window is also allocated
        if self.history_turns > self.max_prompt_tokens:
            raise ValueError(f"prompt.history_turns ({self.history_turns:,}) is over "
                             f"prompt.max_prompt_tokens ({self.max_prompt_tokens:,}): each turn "
                             "of the history takes a token of the prompt at least")
        return self


class EvalParams(Section):
    """Zero-shot and final evaluation: episodes per task, lock-step envs, sampling."""

    tasks: list[str] | None = Field(None, min_length=1)  # null: env.tasks; [] is an error
    episodes_per_task: int = at_most(L.EPISODES, 16, ge=1)
    parallel_envs: int = at_most(L.ENV_SLOTS, 16, ge=1)
    seed: int = at_most(L.SEED, 1000, ge=0)  # episode i of a task resets with seed + i
    temperature: float | None = Field(None, ge=0.0)


class ValidationParams(Section):
    """Prompt validation: samples per task and the gate on the valid-action ratio."""

    samples_per_task: int = at_most(L.EPISODES, 32, ge=1)
    min_valid_action_ratio: float = Field(0.2, ge=0.0, le=1.0)
    seed: int = at_most(L.SEED, 2000, ge=0)  # sample i of a task resets with seed + i


class ChatParams(Section):
    """`rollout.protocol: chat` (verl / slime multi-turn): replies are chat messages, tool calls run
    by the tools and free text answered by the interaction, on the tasks of `env.tasks`
    (docs/conversations.md). File paths are relative to where the stage runs (the repository root
    under DVC)."""

    tools: str | None = None           # tools YAML (class, config, OpenAI function schema)
    interactions: str | None = None    # interactions YAML
    # the entry every episode talks to, by name; null: each task's interaction_kwargs.name
    # picks its own, as in verl (a task without a name: the file's only entry)
    interaction: str | None = None
    # rollout by import path (null: the built-in one, the one a critic plays in fixed-turn batches)
    function: str | None = None
    max_assistant_turns: int = at_most(L.CONTEXT_TOKENS, 4, ge=1)  # each reply is a token at least
    max_user_turns: int = at_most(L.CONTEXT_TOKENS, 2, ge=0)
    # token budget of what a reply is given plus the reply: the whole conversation (context
    # episode), one window and its reply (context window)
    max_tokens: int = at_most(L.CONTEXT_TOKENS, 2048, ge=16)
    max_tool_response_chars: int = at_most(L.TOOL_RESPONSE_CHARS, 1000, ge=1)
    # seconds one tool call (create, execute, calc_reward, release) or interaction call may take;
    # past it the call is an `Error:` tool message (an interaction's ends the run)
    tool_timeout_s: float = at_most(L.TOOL_SECONDS, 60.0, gt=0)
    # the delta-tokenized ids against a full re-render of the messages: strict fails on any text
    # difference; ignore_strippable allows whitespace and stripped <think> spans; off skips it
    # (verl's tokenization_sanity_check_mode values are accepted: disable is off)
    tokenization_check: Literal["strict", "ignore_strippable", "off"] = "strict"

    @field_validator("tokenization_check", mode="before")
    @classmethod
    def _verl_check_mode(cls, value: Any) -> Any:
        return "off" if value == "disable" else value

    @model_validator(mode="after")
    def _interaction_needs_file(self) -> "ChatParams":
        if self.interaction is not None and self.interactions is None:
            raise ValueError(f"rollout.chat.interaction {self.interaction!r} needs "
                             "rollout.chat.interactions (the YAML file that declares it)")
        return self


# the keys of earlier versions, and what replaced them (one line each, not pydantic's "extra")
_RENAMED_ROLLOUT_KEYS = {
    "mode": "rollout.mode is gone: set rollout.protocol (turn → action, sequence → chat) and "
            "rollout.context (window: the last prompt.history_turns turns; episode: all of it)",
    "sequence": "rollout.sequence is now rollout.chat (and its context key is rollout.context)",
}


class RolloutParams(Section):
    """What the model is given for a reply (`context`) and how its reply is read (`protocol`): two
    independent settings (docs/design.md §1). The estimator decides the collection
    (`Params.collection`): fixed-turn batches of exactly n_envs × turns_per_env turns per rank and
    iteration, or n_envs whole episodes (turns_per_env not read)."""

    protocol: Literal["action", "chat"] = "action"
    context: Literal["window", "episode"] = "window"
    n_envs: int = at_most(L.ENV_SLOTS, 8, ge=1)
    turns_per_env: int = at_most(L.EPISODE_TURNS, 8, ge=1)
    chat: ChatParams = ChatParams()
    # your agent, `package.module:function(task, base_url) -> reward`, plays each chat episode
    # through the OpenAI chat API served on the loopback, each call a sample
    # (docs/openai-endpoint.md); an agent still running agent_timeout_s after its rollout started
    # is cut off, its episode aborted
    agent: str | None = None
    agent_timeout_s: float = at_most(L.TOOL_SECONDS, 600.0, gt=0)
    # slime's custom generate, `package.module:generate`, plays each chat episode whole against
    # SGLang's /generate on the loopback (docs/openai-endpoint.md), bounded by agent_timeout_s too
    slime_generate: str | None = None

    def can_be_cut(self) -> bool:
        """Whether this rollout can be cut into fixed-turn batches whose episodes continue across
        updates (the action protocol, an agent's calls, the built-in chat rollout with a history
        window), or plays each episode whole; `Params.collection` decides what is done with it."""
        if self.protocol == "action" or self.agent is not None:
            return True
        return self.context == "window" and self.chat.function is None

    @model_validator(mode="after")
    def _own_rollout_plays_alone(self) -> "RolloutParams":
        """rollout.agent and rollout.slime_generate play chat episodes with their own tools and
        turns: one of them at most, and nothing of rollout.chat's own rollout beside it."""
        keys = (("rollout.agent", self.agent), ("rollout.slime_generate", self.slime_generate))
        named = [f"{key} {value!r}" for key, value in keys if value is not None]
        if len(named) > 1:
            raise ValueError(" and ".join(named) + ": name one")
        if not named:
            return self
        plays = named[0]
        if self.protocol != "chat":
            raise ValueError(f"{plays} plays chat episodes: set rollout.protocol: chat")
        if self.slime_generate is not None and self.context != "episode":
            raise ValueError(f"{plays} plays whole episodes: set rollout.context: episode")
        taken = [f"rollout.chat.{k}" for k in ("function", "tools", "interactions")
                 if getattr(self.chat, k) is not None]
        if taken:
            raise ValueError(f"{plays} plays the episode with its own tools and turns: "
                             f"{', '.join(taken)} would not be read; set "
                             f"{'them' if len(taken) > 1 else 'it'} to null")
        return self

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        for key, why in _RENAMED_ROLLOUT_KEYS.items():
            if isinstance(data, dict) and key in data:
                raise ValueError(why)
        return data


class GAESection(Section):
    """Dual discount: token level inside a turn, step level between turns (docs/design.md §5)."""

    gamma_step: float = Field(0.99, ge=0.0, le=1.0)
    lambda_step: float = Field(0.95, ge=0.0, le=1.0)
    gamma_token: float = Field(1.0, ge=0.0, le=1.0)
    lambda_token: float = Field(1.0, ge=0.0, le=1.0)


class AlgoParams(Section):
    """How rewards become advantages: `gae` (a critic, dual-discount GAE, fixed-turn batches whose
    episodes continue across updates) or a critic-free group estimator, `grpo` or `gigpo`
    (longturn/algo/group_advantages.py), whose iterations play groups of `group_size` episodes
    from one env seed to their end."""

    advantage: Literal[tuple(ESTIMATORS)] = "gae"  # type: ignore[valid-type]  # the table's names
    group_size: int = at_most(L.ENV_SLOTS, 4, ge=2)  # episodes per env seed (critic-free estimators)
    norm_std: bool = True  # divide by the group's std, not only subtract its mean
    step_weight: float = Field(1.0, ge=0.0)  # gigpo: weight of the anchor-state advantage

    @property
    def estimator(self) -> Estimator:
        """The estimator `advantage` names (params/estimator.py): whether a critic exists."""
        return Estimator.named(self.advantage)


class PPOParams(Section):
    """Losses, optimisers and engines of the PPO update (batch sizes count turns per rank)."""

    actor_lr: float = Field(1e-5, gt=0)
    critic_lr: float = Field(1e-4, gt=0)
    clip_ratio: float = Field(0.2, gt=0)
    value_clip: float | None = Field(0.5, gt=0)
    first_token_weight: float = Field(3.0, ge=0)
    entropy_coef: float = Field(0.0, ge=0)
    kl_beta: float = Field(0.001, ge=0)
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    ppo_epochs: int = at_most(L.REPEATS, 1, ge=1)
    mini_batch_size: int = at_most(L.BATCH_ROWS, 16, ge=1)
    micro_batch_size: int = at_most(L.BATCH_ROWS, 8, ge=1)
    grad_clip: float = Field(1.0, gt=0)
    zero_stage: int = Field(0, ge=0, le=3)
    bf16: bool | Literal["auto"] = "auto"  # bf16 autocast (fp32 master weights); auto: as dtype
    lora: bool = True
    lora_r: int = at_most(L.HIDDEN_SIZE, 8, ge=1)
    lora_alpha: float = Field(16.0, gt=0)
    lora_layers: int | None = at_most(L.LAYERS, None, ge=1)
    share_prefix: bool = True
    # actor, reference and critic run the frozen layers below the lowest trainable one (LoRA on
    # the top layers) once per micro-batch and branch; off, or full fine-tuning: each runs whole
    share_trunk: bool = True
    gradient_checkpointing: bool = False  # recompute trained layers' activations in backward
    target_kl: float | None = Field(None, gt=0)  # stop the update's epochs once approx_kl exceeds it

    @model_validator(mode="after")
    def _micro_divides_mini(self) -> "PPOParams":
        if self.mini_batch_size % self.micro_batch_size:
            raise ValueError(f"ppo.mini_batch_size ({self.mini_batch_size}) must be a multiple of "
                             f"ppo.micro_batch_size ({self.micro_batch_size})")
        return self


class WarmupParams(Section):
    """Critic warm-up with the actor frozen: collect once, then refit the critic several times."""

    batches: int = at_most(L.ITERATIONS, 1, ge=1)
    iterations: int = at_most(L.ITERATIONS, 2, ge=1)
    sample_fraction: float = Field(1.0, gt=0, le=1.0)
    max_final_loss: float | None = Field(None, gt=0)


class TrainParams(Section):
    """The train loop: iterations, checkpoints, Kubeflow segment length."""

    iterations: int = at_most(L.ITERATIONS, 5, ge=1)
    checkpoint_every: int = at_most(L.ITERATIONS, 1, ge=1)
    keep_checkpoints: int = at_most(L.ITERATIONS, 2, ge=1)
    iterations_per_task: int = at_most(L.ITERATIONS, 1, ge=1)
    # What runs components/train.py under DVC: `python` (one rank), or e.g.
    # `torchrun --nproc_per_node 8` for one rank per GPU (each rank steps its own envs).
    launcher: str = Field("python", min_length=1)
    # After each checkpoint, push the finished iterations' trajectories and the kept checkpoints
    # to a DVC remote (`remote`: its name in .dvc/config, or a URL such as s3://bucket/path or a
    # local path, added as the remote `longturn-url` in .dvc/config.local; null: the default).
    push: bool = False
    remote: str | None = None


KUBE_CPU = r"^([0-9]*[.])?[0-9]+m?$"                        # "8", "0.5", "500m"
KUBE_MEMORY = r"^[0-9]+(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?$"    # "64Gi", "512Mi"


class PodResources(Section):
    """What one Kubeflow task asks of its node. `shm` sizes a RAM-backed /dev/shm (NCCL, SGLang
    and DataLoader workers pass tensors through it; a pod's default is 64 MiB); it counts
    against the pod's memory."""

    gpus: int = at_most(L.NODE_GPUS, 0, ge=0)
    cpu: str = Field("1", pattern=KUBE_CPU)
    memory: str = Field("4Gi", pattern=KUBE_MEMORY)
    shm: str | None = Field(None, pattern=KUBE_MEMORY)


class Toleration(Section):
    """One Kubernetes toleration, as in a pod spec."""

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class KubeflowResources(Section):
    """Requests per pipeline component (zero-shot and final evaluation share `eval`)."""

    prepare_model: PodResources = PodResources()
    # model-holding CPU tasks: 2 cores and room for the model, its engine and env workers
    validate_prompts: PodResources = PodResources(cpu="2", memory="8Gi", shm="1Gi")
    eval: PodResources = PodResources(cpu="2", memory="8Gi", shm="1Gi")
    critic_warmup: PodResources = PodResources(cpu="2", memory="8Gi", shm="1Gi")
    train: PodResources = PodResources(cpu="4", memory="16Gi", shm="2Gi")
    report: PodResources = PodResources()


class KubeflowParams(Section):
    """`python -m pipeline` only (DVC never reads it): where the model and the run state live on
    the cluster and what each task asks of it. Left out of the params the tasks see, so moving a
    run to other nodes does not invalidate Kubeflow's cache."""

    pvc: str | None = None          # an existing PersistentVolumeClaim (null: nothing mounted)
    mount_path: str = "/models"     # where prepare_model and train segments mount it
    # an object-store URI (s3://, gs://, minio://) of an HF dir, imported as a Model artifact and
    # read by prepare_model instead of model.source (null: model.source, e.g. on the volume)
    model_uri: str | None = None
    # train segments' scratch on the volume (a retried pod resumes from its own checkpoints);
    # null: the pod's own disk (a retry restarts the segment from its input checkpoint)
    work_dir: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)  # GPU tasks only
    tolerations: list[Toleration] = Field(default_factory=list)  # GPU tasks only
    # Kubernetes Secrets as env variables of train tasks, {secret: {key: ENV_NAME}}: the object
    # store's credentials for train.push (e.g. {aws: {id: AWS_ACCESS_KEY_ID, ...}})
    secret_env: dict[str, dict[str, str]] = Field(default_factory=dict)
    resources: KubeflowResources = KubeflowResources()

    @model_validator(mode="after")
    def _paths_on_the_volume(self) -> "KubeflowParams":
        if not self.mount_path.startswith("/"):
            raise ValueError(f"kubeflow.mount_path must be absolute, got {self.mount_path!r}")
        if self.work_dir is not None:
            if self.pvc is None:
                raise ValueError("kubeflow.work_dir needs kubeflow.pvc (a scratch dir on the "
                                 "volume); set kubeflow.work_dir: null to use the pod's disk")
            if not Path(self.work_dir).is_relative_to(self.mount_path):
                raise ValueError(f"kubeflow.work_dir {self.work_dir!r} is not under "
                                 f"kubeflow.mount_path {self.mount_path!r}")
        return self


class Params(Section):
    """The whole params.yaml."""

    seed: int = at_most(L.SEED, 0, ge=0)
    model: ModelParams = ModelParams()
    env: EnvParams = EnvParams()
    prompt: PromptParams = PromptParams()
    engine: EngineParams = EngineParams()
    eval: EvalParams = EvalParams()
    validation: ValidationParams = ValidationParams()
    rollout: RolloutParams = RolloutParams()
    gae: GAESection = GAESection()
    algo: AlgoParams = AlgoParams()
    ppo: PPOParams = PPOParams()
    warmup: WarmupParams = WarmupParams()
    train: TrainParams = TrainParams()
    kubeflow: KubeflowParams = KubeflowParams()

    @property
    def history_window(self) -> int | None:
        """The past turns a reply is given, for either protocol: prompt.history_turns with
        `rollout.context: window`, None (every one) with `episode`. The rollouts read the
        context setting here and nowhere else."""
        return self.prompt.history_turns if self.rollout.context == "window" else None

    @property
    def collection(self) -> Collection:
        """How the train loop collects its batches: the estimator's choice for this rollout.
        Read by the collector (run/protocol.py), the size check and the group check, so they
        cannot disagree."""
        return self.algo.estimator.collection(self.rollout.can_be_cut())

    @model_validator(mode="after")
    def _eval_tasks_default_to_env_tasks(self) -> "Params":
        if self.eval.tasks is None:
            self.eval.tasks = list(self.env.tasks)
        return self

    @model_validator(mode="after")
    def _groups_fill_the_slots(self) -> "Params":
        if (self.collection is Collection.SEED_GROUPS
                and self.rollout.n_envs % self.algo.group_size):
            raise ValueError(f"algo.advantage {self.algo.advantage} plays groups of "
                             f"algo.group_size ({self.algo.group_size}) episodes: rollout.n_envs "
                             f"({self.rollout.n_envs}) must be a multiple of it")
        return self

    @model_validator(mode="after")
    def _sizes_fit(self) -> "Params":
        if problem := size_problem(self):
            raise ValueError(problem)
        return self


class ParamsError(UserError, ValueError):
    """Bad parameters; the message names the file and the dotted key."""


def _why(loc: tuple[Any, ...]) -> str | None:
    """The reason a bounded field gives for its bound (`limits.at_most`), found along `loc`."""
    model: Any = Params
    info = None
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        info = fields[part]
        model = info.annotation
    extra = getattr(info, "json_schema_extra", None)
    return extra.get("why") if isinstance(extra, dict) else None


def _describe(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key '{key}'")
        elif e["type"] == "value_error":  # a rule across keys: its message names them
            lines.append(f"{source}: {e['ctx']['error']}")
        else:
            got = e.get("input")
            shown = repr(got) if not isinstance(got, dict) else "a mapping"
            why = _why(e["loc"]) if e["type"] == "less_than_equal" else None
            lines.append(f"{source}: key '{key}': {e['msg']} (got {shown})"
                         + (f"; the bound: {why}" if why else ""))
    return "\n".join(lines)


def parse_params(data: dict[str, Any] | None, source: str = "params") -> Params:
    """Validate an already-loaded mapping."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ParamsError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    try:
        return Params.model_validate(data)
    except ValidationError as err:
        raise ParamsError(_describe(err, source)) from None


def load_params(path: str | Path) -> Params:
    """Read and validate a params YAML file; an empty one is an error, not the defaults."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from None
    if data is None:  # not the built-in defaults: a truncated or blanked file would run them
        raise ParamsError(f"{path} is empty: write one with `longturn params default` "
                          "(or `make params PROFILE=NAME`)")
    if not isinstance(data, dict):
        raise ParamsError(f"{path} holds a YAML {type(data).__name__}, not a mapping of sections "
                          "(seed, model, env, ...): write one with `longturn params default`")
    return parse_params(data, str(path))
