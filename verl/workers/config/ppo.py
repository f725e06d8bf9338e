"""The whole trainer config: data, models, reward, algorithm, trainer, Ray; and the decisions derived from it.

:class:`PPOConfig` is built once from the composed YAML (:meth:`PPOConfig.from_omegaconf`), in the driver, before
Ray starts; the workers receive it. Its ``check`` holds the rules that span sections (batch sizes that must split,
a rollout that must fit the backend, a fire drill aimed at ranks that exist), on the sizes a step really uses
(:func:`~verl.workers.config.sizes.step_sizes`). The config is never changed after it is built. The decisions that
follow from it (does the run need a reference model, a critic, a separate old-log-prob pass?) are properties here,
the inputs of :func:`~verl.workers.config.plan.build_run_plan`, whose :class:`~verl.workers.config.plan.RunPlan` the
rest of the package reads.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from verl.workers.config.algorithm import (
    FilterGroupsConfig,
    KLControlConfig,
    RolloutCorrectionConfig,
)
from verl.workers.config.async_training import AsyncTrainingConfig
from verl.workers.config.compat import CustomClsConfig, PFPPOConfig, check_ref_strategy
from verl.workers.config.lora import check_lora
from verl.workers.config.megatron import REMOVE_PADDING_NOTE, check_megatron_sections
from verl.workers.config.model_engine import check_model_engine
from verl.workers.config.out_of_scope import DistillationConfig, TransferQueueConfig, feature_message
from verl.workers.config.precision import check_fsdp_precision
from verl.workers.config.profiler import GlobalProfilerConfig, check_profiling, profiler_sections
from verl.workers.config.ray_kwargs import RayKwargsConfig, merged_ray_init
from verl.workers.config.reward import CustomRewardFunctionConfig, name_reward_keys, resolve_reward_section
from verl.workers.config.reward_model import RewardModelConfig
from verl.workers.config.roles import FSDP_STRATEGIES, ActorConfig, CriticConfig, KLType, ModelConfig, RefConfig
from verl.workers.config.rollout import VLLM_ROLLOUT_KEYS, RolloutConfig, check_rollout_layout
from verl.workers.config.schema import (
    BaseConfig,
    FieldError,
    build_config,
    check_int,
    check_number,
    check_one_of,
    refuse_unavailable,
)
from verl.workers.config.sizes import step_sizes
from verl.workers.config.skip import SkipConfig
from verl.workers.config.values import default_at, plain_values

logger = logging.getLogger(__name__)


VERL_IMAGE_PATCH_SIZE = 14  # verl's default data.image_patch_size


@dataclasses.dataclass(frozen=True)
class DataConfig(BaseConfig):
    """``data``: prompt files (or the embedded task), batch size, lengths, order."""

    KEY: ClassVar[str] = "data"

    train_files: str | list[str] | None
    val_files: str | list[str] | None
    num_train_examples: int
    num_val_examples: int
    train_batch_size: int
    gen_batch_size: int | None
    val_batch_size: int | None
    max_prompt_length: int
    max_response_length: int
    truncation: Literal["error", "left", "right"]
    filter_overlong_prompts: bool
    # verl's process count for that filter; here it runs in the driver's process whatever the count (same result)
    filter_overlong_prompts_workers: int
    skip_bad_rows: bool
    prompt_key: str
    reward_fn_key: str
    return_raw_chat: bool
    shuffle: bool
    seed: int
    trust_remote_code: bool
    apply_chat_template_kwargs: Any
    custom_cls: CustomClsConfig
    image_key: str
    video_key: str
    # verl's vision patch size for multimodal prompts: its default (14) only, multimodal data being out of scope
    image_patch_size: int
    # worker processes of the training prompts' DataLoader (verl.utils.dataset.StatefulPromptLoader); 0: in-process
    dataloader_num_workers: int

    def check(self) -> None:
        check_int(self, "filter_overlong_prompts_workers", 1)
        check_int(self, "dataloader_num_workers", 0)
        if self.image_patch_size != VERL_IMAGE_PATCH_SIZE:
            raise FieldError(
                "image_patch_size",
                f"={self.image_patch_size} sets the vision patch size of image and video prompts; multimodal data is "
                f"out of scope here (prompts are text). Leave it at {VERL_IMAGE_PATCH_SIZE}.",
            )
        if not isinstance(self.apply_chat_template_kwargs, Mapping):
            raise FieldError(
                "apply_chat_template_kwargs",
                f"must be a mapping of keyword arguments, got {self.apply_chat_template_kwargs!r}.",
            )
        check_int(self, "num_train_examples", 1)
        check_int(self, "num_val_examples", 0)
        # 0 is verl's fully async setting: a local update's prompts then come from async_training.require_batches
        check_int(self, "train_batch_size", 0)
        check_int(self, "gen_batch_size", 1)
        check_int(self, "val_batch_size", 1)
        check_int(self, "max_prompt_length", 1)
        check_int(self, "max_response_length", 1)
        check_int(self, "seed", 0)


@dataclasses.dataclass(frozen=True)
class ActorRolloutRefConfig(BaseConfig):
    """``actor_rollout_ref``: the policy's model, its training, its reference and its rollout."""

    KEY: ClassVar[str] = "actor_rollout_ref"

    model: ModelConfig
    actor: ActorConfig
    ref: RefConfig
    rollout: RolloutConfig
    hybrid_engine: bool
    nccl_timeout: float | None

    def check(self) -> None:
        check_number(self, "nccl_timeout", 0.0, exclusive_min=True)
        check_ref_strategy(self.actor.strategy, self.ref.strategy)


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig(BaseConfig):
    """``algorithm``: the advantage estimator and its constants, and the KL penalty in the reward."""

    KEY: ClassVar[str] = "algorithm"

    adv_estimator: str
    norm_adv_by_std_in_grpo: bool
    gamma: float
    lam: float
    use_kl_in_reward: bool
    kl_penalty: KLType
    gdpo_reward_keys: list[str] | None
    gdpo_reward_weights: list[float] | None
    filter_groups: FilterGroupsConfig
    rollout_correction: RolloutCorrectionConfig
    kl_ctrl: KLControlConfig
    use_pf_ppo: bool
    pf_ppo: PFPPOConfig

    # estimators that need what this trainer does not produce, and what that is
    UNAVAILABLE_ESTIMATORS: ClassVar[dict[str, str]] = {
        "remax": "reward baselines from a greedy rollout (reward_baselines)",
        "optimal_token_baseline": "sum_pi_squared, the per-token sum of squared probabilities, from the actor",
        "tir_optimal_token_baseline": "sum_pi_squared, the per-token sum of squared probabilities, from the actor",
    }

    def check(self) -> None:
        from verl.algorithms.core_algos import ADV_ESTIMATOR_REGISTRY

        check_one_of(self, "adv_estimator", ADV_ESTIMATOR_REGISTRY.names(), "registered advantage estimators")
        missing = self.UNAVAILABLE_ESTIMATORS.get(self.adv_estimator)
        if missing is not None:
            raise FieldError(
                "adv_estimator",
                f"={self.adv_estimator} needs {missing}, which this trainer does not compute yet; use grpo, rloo, "
                "reinforce_plus_plus or another registered estimator.",
            )
        check_number(self, "gamma", 0.0, 1.0)
        check_number(self, "lam", 0.0, 1.0)
        self._check_gdpo()
        refuse_unavailable(self, "use_pf_ppo", "PF-PPO sample reweighting (not implemented here yet)")
        if self.use_pf_ppo and self.adv_estimator != "gae":  # verl applies PF-PPO in its gae branch only
            raise FieldError(
                "use_pf_ppo",
                f"=true reweights GAE samples (PF-PPO); with adv_estimator={self.adv_estimator} nothing would read "
                "it. Use adv_estimator=gae, or set use_pf_ppo=false.",
            )

    def _check_gdpo(self) -> None:
        keys, weights = self.gdpo_reward_keys, self.gdpo_reward_weights
        if self.adv_estimator == "gdpo" and not keys:
            raise FieldError(
                "gdpo_reward_keys",
                "is empty, and adv_estimator=gdpo normalises each reward component on its own: list the keys your "
                "reward function returns in its result dict, e.g. algorithm.gdpo_reward_keys=[format,accuracy].",
            )
        if weights is not None and (keys is None or len(weights) != len(keys)):
            raise FieldError(
                "gdpo_reward_weights",
                f"has {len(weights)} entries for {len(keys or [])} gdpo_reward_keys; give one weight per key, or "
                "null (all 1).",
            )


@dataclasses.dataclass(frozen=True)
class TrainerConfig(BaseConfig):
    """``trainer``: length, checkpoints, validation, logging, placement."""

    KEY: ClassVar[str] = "trainer"

    total_epochs: int
    total_training_steps: int | None
    save_freq: int
    test_freq: int
    val_before_train: bool
    critic_warmup: int
    balance_batch: bool
    default_local_dir: str
    resume_mode: Literal["auto", "disable", "resume_path"]
    resume_from_path: str | None
    logger: list[str]
    project_name: str
    experiment_name: str
    plot: bool
    progress_bar: bool
    nnodes: int
    n_gpus_per_node: int
    device: str
    max_restarts: int
    collective_timeout_s: float
    nccl_blocking_wait: bool
    placement_timeout_s: float
    colocate_roles: bool
    log_val_generations: int
    max_actor_ckpt_to_keep: int | None
    max_critic_ckpt_to_keep: int | None
    use_legacy_worker_impl: Literal["auto", "enable", "disable"]

    @classmethod
    def from_shorthand(cls, value: Any, key: str) -> Any:
        """verl's scripts say ``trainer.logger=console`` as often as a list, and some pass a list as the string
        ``'[console,wandb]'``: either string becomes the list it means while the section is built
        (:func:`verl.utils.tracking.sink_names`)."""
        from verl.utils.tracking import sink_names

        if isinstance(value, Mapping) and isinstance(value.get("logger"), str):
            return {**value, "logger": sink_names(value["logger"])}
        return value

    def check(self) -> None:
        from verl.utils.tracking import LOGGERS

        if self.device == "npu":
            raise FieldError("device", feature_message("npu", "=npu", "Use auto, cuda or cpu."))
        check_one_of(self, "device", ("auto", "cuda", "cpu"))
        check_int(self, "log_val_generations", 0)
        check_int(self, "max_actor_ckpt_to_keep", 1)
        check_int(self, "max_critic_ckpt_to_keep", 1)

        check_int(self, "total_epochs", 1)
        check_int(self, "total_training_steps", 1)
        check_int(self, "nnodes", 1)
        check_int(self, "n_gpus_per_node", 1)
        check_int(self, "max_restarts", 0)
        check_number(self, "collective_timeout_s", 0.0, exclusive_min=True)
        check_number(self, "placement_timeout_s", 0.0, exclusive_min=True)
        check_int(self, "critic_warmup", 0)
        unknown = [name for name in self.logger if name not in LOGGERS]
        if unknown:
            raise FieldError("logger", f"has unknown sink(s) {unknown}; use a list of {list(LOGGERS)}.")
        if self.resume_mode == "resume_path" and not self.resume_from_path:
            raise ValueError(
                "trainer.resume_mode=resume_path needs trainer.resume_from_path=<a global_step_N directory>."
            )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node


@dataclasses.dataclass(frozen=True)
class RolloutGroupConfig(BaseConfig):
    """``rollout``: the rollout worker group of its own (``actor_rollout_ref.hybrid_engine=false``), as verl's
    one-step-off and fully async trainers size it; read only in that mode."""

    KEY: ClassVar[str] = "rollout"

    nnodes: int
    n_gpus_per_node: int
    total_rollout_steps: int | None
    total_epochs: int | None
    test_freq: int | None

    def check(self) -> None:
        check_int(self, "nnodes", 1)
        check_int(self, "n_gpus_per_node", 1)
        check_int(self, "total_rollout_steps", 1)
        check_int(self, "total_epochs", 1)
        check_int(self, "test_freq", 1)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node


@dataclasses.dataclass(frozen=True)
class RayInitConfig(BaseConfig):
    """``ray_init``: join a cluster (an address) or start a local Ray instance."""

    KEY: ClassVar[str] = "ray_init"

    address: str | None
    num_cpus: int | None

    def check(self) -> None:
        check_int(self, "num_cpus", 1)


@dataclasses.dataclass(frozen=True)
class PPOConfig(BaseConfig):
    """The composed trainer config, validated; see ``verl/trainer/config/ppo_trainer.yaml`` for every key."""

    KEY: ClassVar[str] = ""

    # dp | megatron: the engine whose actor, reference and critic files the YAML composed (model_engine.py)
    model_engine: str
    data: DataConfig
    actor_rollout_ref: ActorRolloutRefConfig
    critic: CriticConfig
    reward_model: RewardModelConfig
    custom_reward_function: CustomRewardFunctionConfig
    algorithm: AlgorithmConfig
    trainer: TrainerConfig
    rollout: RolloutGroupConfig
    async_training: AsyncTrainingConfig
    ray_init: RayInitConfig
    # verl's Ray section: ray.init's keyword arguments and the timeline file (ray_kwargs.py)
    ray_kwargs: RayKwargsConfig
    global_profiler: GlobalProfilerConfig
    # verl's rollout dump/replay (skip.rollout; the other sub-sections refused when enabled)
    skip: SkipConfig
    # verl's out-of-scope sections: their off switch only (out_of_scope.py)
    transfer_queue: TransferQueueConfig
    distillation: DistillationConfig

    @classmethod
    def from_omegaconf(cls, config: Any, defaults: Any = None) -> PPOConfig:
        """Validate a composed Hydra/OmegaConf config (or a plain mapping) into a :class:`PPOConfig`.

        Args:
            config: the composed config; a ``hydra`` section is ignored.
            defaults: the same config file composed without overrides
                (:attr:`~verl.workers.config.loading.ComposedConfig.defaults`). With it, a setting changed from its
                default where nothing reads it (an FSDP2 section of a model that trains with ``dp``, a vLLM engine
                key with another rollout) is refused; None skips that comparison. The command line and
                :func:`~verl.workers.config.compose_ppo_config` pass it. It happens here, once, and not in
                ``check``: validating (``__post_init__``, ``replace()``) reads no files. verl's ``reward``
                section is folded into ``reward_model`` / ``custom_reward_function`` first
                (:func:`~verl.workers.config.reward.resolve_reward_section`, which compares with the defaults too).

        Raises:
            ValueError: any key missing, unknown, of the wrong type, out of range, or inconsistent with another; a
                setting nothing reads; a ``reward.*`` key and its older twin set to different values.
        """
        values, origins = resolve_reward_section(plain_values(config), defaults)
        try:
            typed = build_config(cls, values, "")
        except ValueError as err:
            raise name_reward_keys(err, origins) from None
        if defaults is not None:
            typed._check_settings_apply(defaults)
        return typed

    # ------------------------------------------------------------------ cross-section rules

    def _check_megatron_layout(self) -> None:
        """main_ppo runs megatron tensor parallelism and pipeline stages (the actor's and the critic's; the ranks of
        a model-parallel group share their data): each layout must divide the ranks."""
        actor = self.actor_rollout_ref.actor
        key = "actor_rollout_ref.actor.megatron"
        layouts = [(key, actor.megatron)] if actor.strategy == "megatron" else []
        if self.needs_critic and self.critic_strategy == "megatron":
            layouts.append(("critic.megatron", self.critic.megatron))
        for section_key, megatron in layouts:
            tp, pp = megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size
            if self.world_size % (tp * pp):
                sizes = f"{section_key}.tensor_model_parallel_size={tp}"
                if pp > 1:
                    sizes += f" x pipeline_model_parallel_size={pp}"
                raise ValueError(
                    f"{sizes} does not divide the {self.world_size} ranks (trainer.nnodes x trainer.n_gpus_per_node); "
                    "make the rank count a multiple of it."
                )

    def check(self) -> None:
        check_model_engine(self.model_engine, self.actor_rollout_ref.actor.strategy)
        merged_ray_init(self.ray_init, self.ray_kwargs)  # ray_init and ray_kwargs.ray_init must agree
        self.skip.check_applies(self.separate_rollout)
        self._check_step_batch_size()
        actor = self.actor_rollout_ref.actor
        if self.actor_rollout_ref.rollout.name == "hf" and actor.strategy != "dp":
            raise ValueError("actor_rollout_ref.rollout.name=hf needs a Hugging Face actor (strategy=dp); use naive.")
        self._check_megatron_layout()
        self._check_hf_only_features()
        if self.algorithm.adv_estimator == "gae" and not self.needs_critic:
            raise ValueError("algorithm.adv_estimator=gae needs a value model: set critic.enable=true (or auto).")
        for key, on in (
            ("actor_rollout_ref.actor.use_kl_loss", actor.use_kl_loss),
            ("algorithm.use_kl_in_reward", self.algorithm.use_kl_in_reward),
        ):
            if on and not self.needs_reference:
                raise ValueError(
                    f"{key}=true needs reference log-probs: set actor_rollout_ref.ref.enable to auto or true."
                )
        if self.reward_model.custom_score_fn and self.custom_reward_function.path:
            raise ValueError(
                "reward_model.custom_score_fn and custom_reward_function.path both name a scoring function; set one."
            )
        self._check_rollout_log_probs_as_old()
        self._check_rollout()
        self._check_multi_turn()
        self._check_separate_rollout()
        self._check_dapo()
        self._check_token_budgets()
        self._check_batch_sizes()
        self._check_fire_drill_ranks()
        self._check_training_paths()
        check_fsdp_precision(self)
        check_megatron_sections(self)
        check_lora(self)
        self._check_profiling()

    def profiler_sections(self) -> dict[str, list[tuple[str, Any]]]:
        """Per worker group that can be profiled, its roles' ``profiler`` sections as ``(key, section)`` (see
        :func:`~verl.workers.config.profiler.profiler_sections`)."""
        return profiler_sections(self)

    def _check_profiling(self) -> None:
        check_profiling(self)

    def _check_dapo(self) -> None:
        buffer = self.reward_model.overlong_buffer
        if buffer.enable and buffer.len > self.data.max_response_length:
            raise ValueError(
                f"reward_model.overlong_buffer.len={buffer.len} exceeds data.max_response_length="
                f"{self.data.max_response_length}: the buffer is the end of the response length; shorten it."
            )

    def _check_rollout_log_probs_as_old(self) -> None:
        correction = self.algorithm.rollout_correction
        if self.actor_rollout_ref.actor.use_rollout_log_probs and not correction.bypass_mode:
            if correction.rollout_is is not None or correction.rollout_rs is not None:
                raise ValueError(
                    "actor_rollout_ref.actor.use_rollout_log_probs=true makes the rollout's log-probs the old ones, so "
                    "pi_old / pi_rollout is 1 and algorithm.rollout_correction.rollout_is / rollout_rs would do "
                    "nothing; set algorithm.rollout_correction.bypass_mode=true to correct against the current "
                    "policy instead, or turn use_rollout_log_probs off."
                )

    def _check_rollout(self) -> None:
        """The rollout's rules that read other sections: its parallel layout in the actor group, and the rollout
        log-probs (``calculate_log_probs``) that rollout correction and bypass mode need."""
        arr = self.actor_rollout_ref
        check_rollout_layout(arr.rollout, arr.actor, self.world_size, self.data.max_prompt_length)
        needs_log_probs = self.algorithm.rollout_correction.enabled or arr.actor.use_rollout_log_probs
        if needs_log_probs and not arr.rollout.calculate_log_probs:
            raise ValueError(
                "actor_rollout_ref.rollout.calculate_log_probs=false leaves the rollout's log-probs out of the batch, "
                "and algorithm.rollout_correction (or actor.use_rollout_log_probs) needs them; set "
                "actor_rollout_ref.rollout.calculate_log_probs=true."
            )

    def _check_multi_turn(self) -> None:
        """verl's agent loops (``rollout.multi_turn.enable``) run on the actor workers' rollout: not with a rollout
        group of its own, nor with the replayed rollouts of ``skip.rollout``."""
        if not self.actor_rollout_ref.rollout.multi_turn.enable:
            return
        key = "actor_rollout_ref.rollout.multi_turn.enable=true"
        if self.separate_rollout:
            raise ValueError(
                f"{key} runs the agent loops on the actor workers' rollout; with actor_rollout_ref.hybrid_engine=false "
                "(a rollout group of its own, one-step-off / fully async) multi-turn rollouts are not supported yet. "
                "Set hybrid_engine=true."
            )
        if self.skip.rollout.enable:
            raise ValueError(
                f"{key} with skip.rollout.enable=true: replayed rollouts are single-turn only; turn one off."
            )

    def _check_step_batch_size(self) -> None:
        """A step needs at least one prompt: ``data.train_batch_size``, or verl's fully async size from
        ``async_training.require_batches`` (:func:`~verl.workers.config.sizes.step_sizes`)."""
        size = self._train_batch_size
        if size < 1:
            raise ValueError(
                f"data.train_batch_size={size}: a step needs at least one prompt (0 is verl's fully async setting, "
                "where async_training.require_batches sizes each local update, with hybrid_engine=false)."
            )

    @property
    def _train_batch_size(self) -> int:
        """The prompts of one step as the run applies them (the plan's ``train_batch_size``)."""
        return step_sizes(self).train_batch_size

    def _check_separate_rollout(self) -> None:
        """A rollout worker group of its own (``hybrid_engine=false``, one step off policy): prompts that split over
        its ranks, and no engine layout that spans the actor's ranks. Every actor backend feeds it Hugging Face
        weights (megatron's tensor-parallel shards and pipeline stages gathered; the layouts it cannot gather are
        refused by its own section). ``async_training`` and the top-level ``rollout`` section are read only then
        (see :meth:`_check_settings_apply`)."""
        if self.actor_rollout_ref.hybrid_engine:
            return
        arr, world = self.actor_rollout_ref, self.rollout.world_size
        if arr.rollout.name == "vllm" and arr.rollout.tensor_model_parallel_size > 1:
            raise ValueError(
                "actor_rollout_ref.rollout.tensor_model_parallel_size>1 with hybrid_engine=false: each rank of the "
                "rollout group runs an engine of its own here; set it to 1 and size the group with "
                "rollout.n_gpus_per_node."
            )
        if self.async_training.partial_rollout and arr.rollout.name not in ("naive", "vllm"):
            raise ValueError(
                f"async_training.partial_rollout=true with actor_rollout_ref.rollout.name={arr.rollout.name}: the "
                "naive rollout stops between two tokens for new weights, and vllm switches every 32 tokens (each "
                "engine call samples at most that many); hf finishes each response with the weights it started "
                "with. Use rollout.name=naive or vllm, or partial_rollout=false."
            )
        if self._train_batch_size % world:
            raise ValueError(
                f"data.train_batch_size={self._train_batch_size} must be a multiple of the {world} rollout "
                "workers (rollout.nnodes x rollout.n_gpus_per_node), which split each batch's prompts."
            )

    def _check_hf_only_features(self) -> None:
        """On megatron, two Hugging Face model switches are accepted and logged. ``enable_gradient_checkpointing``
        changes nothing there, as in verl, whose megatron engine never reads it: megatron-core recomputes what
        ``megatron.override_transformer_config.recompute_*`` asks for (verl's megatron scripts set both). Padding-free
        passes (``use_remove_padding=true``, verl's packed sequences): the megatron backend runs padded rows, with the
        same results. Activation offload (``enable_activation_offload``) is built on ``fsdp2`` alone, as in verl (its
        FSDP engine), and refused elsewhere."""
        arr = self.actor_rollout_ref
        models = [("actor_rollout_ref.model", arr.actor.strategy, arr.model, arr.actor.megatron, ActorConfig.KEY)]
        if self.needs_critic:
            models.append(("critic.model", self.critic_strategy, self.critic.model, self.critic.megatron, "critic"))
        for key, strategy, model, megatron, section in models:
            if model.enable_activation_offload and strategy not in FSDP_STRATEGIES:
                instead = (
                    f"; megatron-core recomputes activations instead ({section}.megatron.override_transformer_config."
                    "recompute_granularity)"
                    if strategy == "megatron"
                    else f", or {key}.enable_gradient_checkpointing=true to save activation memory on {strategy}"
                )
                raise ValueError(
                    f"{key}.enable_activation_offload=true with {section}.strategy={strategy}: activation offload is "
                    f"built on the fsdp2 backend here (verl's FSDP engine); set {section}.strategy=fsdp2, or set the "
                    f"key to false{instead}."
                )
            if strategy != "megatron":
                continue
            if model.enable_gradient_checkpointing:
                granularity = dict(megatron.override_transformer_config or {}).get("recompute_granularity")
                logger.log(
                    logging.INFO if granularity else logging.WARNING,
                    "%s.enable_gradient_checkpointing=true on megatron: as in verl, the megatron-core model does not "
                    "read it; its activation recomputation is %s.megatron.override_transformer_config."
                    "recompute_granularity=%s%s",
                    key,
                    section,
                    granularity,
                    "" if granularity else " (nothing recomputed; set full or selective to recompute)",
                )
            if model.use_remove_padding:
                logger.info("%s.use_remove_padding=true on megatron: %s", key, REMOVE_PADDING_NOTE)

    def _trained_sections(self) -> list[tuple[Any, str]]:
        sections = [(self.actor_rollout_ref.actor, ActorConfig.KEY)]
        if self.needs_critic:
            sections.append((self.critic, CriticConfig.KEY))
        return sections

    def _check_batch_sizes(self) -> None:
        """verl's batch-size rules (its ``validate_config`` and its workers' normalisation): mini-batches of prompts
        x ``rollout.n`` split over the ranks, a micro-batch size wherever a pass has no token budget, and a set
        micro-batch size dividing the per-rank mini-batch (checked, as verl does, even with a token budget)."""
        world, n = self.trainer.world_size, self.actor_rollout_ref.rollout.n
        train_bs = self._train_batch_size
        if train_bs % world:
            raise ValueError(
                f"data.train_batch_size={train_bs} must be a multiple of the {world} data-parallel workers "
                f"(trainer.n_gpus_per_node x trainer.nnodes)."
            )
        self._check_micro_batch_sizes_set()
        for section, key in self._trained_sections():
            mini, micro = section.ppo_mini_batch_size, section.ppo_micro_batch_size_per_gpu
            if train_bs % mini:
                raise ValueError(
                    f"data.train_batch_size={train_bs} is not a multiple of {key}.ppo_mini_batch_size={mini}; each "
                    f"training batch must split into whole mini-batches."
                )
            dp = world // self._model_parallel_size(section)  # ranks of one model-parallel group share rows
            if (mini * n) % dp or (micro is not None and ((mini * n) // dp) % micro):
                raise ValueError(
                    f"{key}.ppo_mini_batch_size x rollout.n = {mini * n} samples over {dp} data-parallel rank(s) "
                    f"must give a multiple of {key}.ppo_micro_batch_size_per_gpu={micro} per rank; change one of them."
                )

    def _model_parallel_size(self, section) -> int:
        """How many ranks split ``section``'s model (megatron tensor parallelism x pipeline stages; 1 for any other
        backend)."""
        strategy = self.critic_strategy if section is self.critic else self.actor_rollout_ref.actor.strategy
        return section.megatron.model_parallel_size if strategy == "megatron" else 1

    def _check_micro_batch_sizes_set(self) -> None:
        """Each pass that runs splits by a sample count unless it and the actor both have token budgets (verl asks
        for the log-prob passes' sizes whenever the actor's ``use_dynamic_bsz`` is false)."""
        arr, actor_dynamic = self.actor_rollout_ref, self.actor_rollout_ref.actor.use_dynamic_bsz
        passes = [
            (ActorConfig.KEY, "ppo_micro_batch_size_per_gpu", arr.actor.ppo_micro_batch_size_per_gpu, actor_dynamic),
            (
                "actor_rollout_ref.rollout",
                "log_prob_micro_batch_size_per_gpu",
                arr.rollout.log_prob_micro_batch_size_per_gpu,
                actor_dynamic and arr.rollout.log_prob_use_dynamic_bsz,
            ),
        ]
        if self.needs_reference:
            size, dynamic = arr.ref.log_prob_micro_batch_size_per_gpu, arr.ref.log_prob_use_dynamic_bsz
            passes.append((RefConfig.KEY, "log_prob_micro_batch_size_per_gpu", size, actor_dynamic and dynamic))
        if self.needs_critic:
            for name in ("ppo_micro_batch_size_per_gpu", "forward_micro_batch_size_per_gpu"):
                passes.append(("critic", name, getattr(self.critic, name), self.critic.use_dynamic_bsz))
        for section, name, size, dynamic in passes:
            if size is None and not dynamic:
                budget = f"{CriticConfig.KEY if section == 'critic' else ActorConfig.KEY}.ppo_max_token_len_per_gpu"
                raise ValueError(
                    f"{section}.{name} is not set: it is required (as in verl) unless micro-batches are cut by "
                    f"token budget. Set {section}.{name}=<samples per micro-batch on each rank>, or set "
                    f"actor_rollout_ref.actor.use_dynamic_bsz=true (critic.use_dynamic_bsz for the critic) with "
                    f"{budget}."
                )

    def _check_token_budgets(self) -> None:
        """A token budget must hold the longest sample (prompt + response), or one sample would not fit at all."""
        longest = self.data.max_prompt_length + self.data.max_response_length
        arr = self.actor_rollout_ref
        budgets = [
            (
                arr.actor.use_dynamic_bsz,
                arr.actor.ppo_max_token_len_per_gpu,
                f"{ActorConfig.KEY}.ppo_max_token_len_per_gpu",
            ),
            (
                arr.rollout.log_prob_use_dynamic_bsz,
                arr.rollout.log_prob_max_token_len_per_gpu,
                "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
            ),
            (
                arr.ref.log_prob_use_dynamic_bsz,
                arr.ref.log_prob_max_token_len_per_gpu,
                f"{RefConfig.KEY}.log_prob_max_token_len_per_gpu",
            ),
        ]
        if self.needs_critic:
            budgets += [
                (
                    self.critic.use_dynamic_bsz,
                    self.critic.ppo_max_token_len_per_gpu,
                    "critic.ppo_max_token_len_per_gpu",
                ),
                (
                    self.critic.use_dynamic_bsz,
                    self.critic.forward_max_token_len_per_gpu,
                    "critic.forward_max_token_len_per_gpu",
                ),
            ]
        for used, budget, key in budgets:
            if used and budget < longest:
                raise ValueError(
                    f"{key}={budget} is below the longest sample, data.max_prompt_length + data.max_response_length "
                    f"= {longest} tokens; raise it to at least {longest}."
                )

    def _check_fire_drill_ranks(self) -> None:
        world = self.trainer.world_size
        for section, key in self._trained_sections():
            ranks = section.fault_injection.ranks
            if ranks is not None and any(rank >= world for rank in ranks):
                raise ValueError(
                    f"{key}.fault_injection.ranks={ranks} names ranks that do not exist: this run has {world} "
                    f"rank(s), 0 to {world - 1}; a drill aimed there would never fire."
                )

    def _check_training_paths(self) -> None:
        if self.trainer.device != "cpu":
            return  # auto: checked again once resolve_device decides it; cuda: the worker's builders check
        actor = self.actor_rollout_ref.actor
        if actor.strategy == "megatron":
            actor.megatron.training_path("cpu", f"{ActorConfig.KEY}.megatron")
        if self.needs_critic and self.critic_strategy == "megatron":
            self.critic.megatron.training_path("cpu", f"{CriticConfig.KEY}.megatron", has_megatron_optimizer_path=False)

    def _check_settings_apply(self, defaults: Any) -> None:
        """Settings changed from their ``defaults`` where nothing reads them would do nothing: refuse them, saying why.

        FSDP2 sections apply to a model on ``fsdp2``/``fsdp``; the vLLM engine keys to ``rollout.name=vllm``;
        ``async_training``, the top-level ``rollout`` section and ``data.gen_batch_size`` to a rollout group of its
        own (``actor_rollout_ref.hybrid_engine=false``).
        ``defaults`` is the composed config (or a plain mapping) of the file this one was composed from (see
        :meth:`from_omegaconf`), so a file that sets one of these keys itself is not refused for it. Only the keys
        compared are resolved there: an interpolation elsewhere in the defaults that the user's overrides replaced
        (``${oc.env:...}``, say) does not have to resolve.
        """
        arr = self.actor_rollout_ref
        unused: list[tuple[str, Any, str]] = []  # (key, value, what would make it apply)
        for strategy, value, key, owner in [
            (arr.actor.strategy, arr.actor.fsdp_config, f"{ActorConfig.KEY}.fsdp_config", ActorConfig.KEY),
            (arr.actor.strategy, arr.ref.fsdp_config, f"{RefConfig.KEY}.fsdp_config", ActorConfig.KEY),
            (self.critic_strategy, self.critic.model.fsdp_config, "critic.model.fsdp_config", "critic"),
        ]:
            if strategy not in FSDP_STRATEGIES and (owner != "critic" or self.needs_critic):
                unused.append((key, value.to_dict(), f"{owner}.strategy=fsdp2 (it trains with {strategy})"))
        if arr.rollout.name != "vllm":
            fix = f"{RolloutConfig.KEY}.name=vllm (the rollout is {arr.rollout.name})"
            for name in VLLM_ROLLOUT_KEYS:
                value = getattr(arr.rollout, name)
                plain = value.to_dict() if isinstance(value, BaseConfig) else value
                unused.append((f"{RolloutConfig.KEY}.{name}", plain, fix))
        if not self.separate_rollout:
            fix = "actor_rollout_ref.hybrid_engine=false (a rollout worker group of its own; here the rollout lives "
            fix += "in the actor workers)"
            for section in (self.async_training, self.rollout):
                unused += [(f"{section.KEY}.{name}", value, fix) for name, value in section.to_dict().items()]
            unused.append(("data.gen_batch_size", self.data.gen_batch_size, fix))
        unused += self.skip.unused_settings()
        mtp_fix = f"{ModelConfig.KEY}.mtp.enable=true, which is refused here (multi-token prediction is not built)"
        unused.append((f"{ModelConfig.KEY}.mtp", arr.model.mtp.to_dict(), mtp_fix))
        # every such key in one message: a script switched to another rollout hears all it has to drop at once
        changed = [(key, fix) for key, value, fix in unused if value != default_at(defaults, key)]
        if len(changed) == 1:
            key, fix = changed[0]
            raise ValueError(
                f"{key} is set, but nothing reads it: it applies with {fix}. Set that, or leave {key} at its default."
            )
        if changed:
            lines = [f"  - {key}: applies with {fix}" for key, fix in changed]
            raise ValueError(
                f"{len(changed)} settings are set, but nothing reads them; set what each applies with, or leave "
                "them at their defaults (remove them):\n" + "\n".join(lines)
            )

    # ------------------------------------------------------------------ decisions

    @property
    def needs_reference(self) -> bool:
        """Whether the actor workers build a frozen reference model (``ref.enable``; auto: when a KL loss needs it)."""
        enable = self.actor_rollout_ref.ref.enable
        wanted = self.actor_rollout_ref.actor.use_kl_loss or self.algorithm.use_kl_in_reward
        return wanted if enable == "auto" else bool(enable)

    @property
    def needs_critic(self) -> bool:
        """Whether a value model trains (``critic.enable``; auto: when the advantage estimator needs values)."""
        enable = self.critic.enable
        return self.algorithm.adv_estimator == "gae" if enable == "auto" else bool(enable)

    @property
    def critic_strategy(self) -> str:
        """The critic's backend: ``critic.strategy``, or the actor's when null."""
        return self.critic.strategy or self.actor_rollout_ref.actor.strategy

    @property
    def computes_old_log_prob(self) -> bool:
        """Whether a training step runs the separate old-log-prob pass (``actor.recompute_old_log_prob``).

        ``auto`` skips it when the step makes exactly one policy update (``ppo_epochs`` 1 and ``ppo_mini_batch_size``
        equal to ``data.train_batch_size``): that update runs on the weights that sampled the batch, so its own
        detached log-probs are the old log-probs and the ratio is exactly 1, as in an on-policy GRPO step.
        """
        actor, correction = self.actor_rollout_ref.actor, self.algorithm.rollout_correction
        if self.uses_rollout_log_probs_as_old:
            return False  # the rollout's own log-probs are the old ones
        if actor.recompute_old_log_prob is True or self.algorithm.use_kl_in_reward or self.prox_log_prob_pass:
            return True  # the KL penalty in the reward is computed from the old log-probs, before any update
        if correction.rollout_is is not None or correction.rollout_rs is not None:
            return True  # the importance weights pi_old / mu need pi_old before the update
        one_update = actor.ppo_epochs == 1 and actor.ppo_mini_batch_size == self._train_batch_size
        return not one_update

    @property
    def uses_rollout_log_probs_as_old(self) -> bool:
        """Whether the rollout's log-probs serve as the old ones (``rollout_correction.bypass_mode`` or verl's
        ``actor.use_rollout_log_probs``), with no old-log-prob pass."""
        if self.algorithm.rollout_correction.bypass_mode or self.actor_rollout_ref.actor.use_rollout_log_probs:
            return True
        from_async = self.separate_rollout and bool(self.async_training.use_rollout_log_probs)
        return from_async and not self.prox_log_prob_pass

    @property
    def world_size(self) -> int:
        return self.trainer.world_size

    @property
    def separate_rollout(self) -> bool:
        """Whether the rollout runs in a worker group of its own, one step off policy (``hybrid_engine=false``)."""
        return not self.actor_rollout_ref.hybrid_engine

    @property
    def prox_log_prob_pass(self) -> bool:
        """verl's ``async_training.compute_prox_log_prob`` with a rollout group of its own: the trainer computes the
        old (proximal) log-probs, and the rollout's serve rollout correction."""
        return self.separate_rollout and self.async_training.compute_prox_log_prob
