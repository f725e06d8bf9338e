"""The Ray workers that own the models of one data-parallel rank: actor + rollout + reference, and critic.

The driver calls their ``@register``'ed methods on the whole group; DataProto arguments are split across ranks and
the results gathered (``Dispatch.DP_COMPUTE_PROTO``). A worker receives its own config section
(``actor_rollout_ref``, ``critic``), the :class:`~verl.workers.config.plan.RunPlan` (the device, which passes a step
runs, the step count, the responses per prompt) and its role's profiler settings, never the whole config;
:meth:`SectionWorker.from_config` builds one from a whole config (tests, scripts). A worker hosts its roles'
objects: the actor, the reference and the rollout (:class:`~verl.workers.roles.rollout.RolloutRole`), or the critic.
The backend (``dp``, ``fsdp2``, ``megatron``) decides how the models are built
(:meth:`ActorRolloutRefWorker._build_actor`, :meth:`CriticWorker._build_critic`) and what happens around each pass
(:meth:`_ModelWorker._placed_for`, which every pass enters through :meth:`_ModelWorker.phase`: megatron's
offloading); everything else — rollout, log-probs, updates, checkpoints — is the same code for all. A registered
method overridden in a subclass stays registered with its mode
(:func:`~verl.single_controller.decorator.registered_methods`).

Every call that computes log-probs or trains the actor (``compute_log_prob``, ``compute_ref_log_prob``,
``update_actor``, ``generate_with_log_probs``) takes the sampling temperature the samples were drawn at: the batch's
``meta_info["temperature"]`` when the caller set one (a per-call override, which the rollout honours when it
samples), else the config's (``actor_rollout_ref.rollout.temperature``); ``generate_sequences`` tags its output with
the temperature it sampled at. So log-probs are always taken at the sampling temperature, and the actor itself has
no default to fall back on.

A rollout that holds its own copy of the weights (``vllm``: an engine colocated in this worker) is kept in step with
the actor: after every :meth:`ActorRolloutRefWorker.update_actor` whose result says an update was applied
(:attr:`~verl.workers.update_outcome.result.UpdateResult.updated`), and after a checkpoint is loaded, the actor's
weights stream into it with Hugging Face names, a tensor at a time (:meth:`ActorRolloutRefWorker._iter_hf_weights`,
which a backend overrides when its module is not a Hugging Face model or is sharded).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller import Dispatch, Worker, register
from verl.utils.checkpoint import load_state, rng_state_path, save_state
from verl.workers.actor.base import BasePPOActor
from verl.workers.config import ActorConfig, ActorRolloutRefConfig, CriticConfig, PPOConfig
from verl.workers.config.plan import RoleProfilerSettings, RunPlan, role_profiler_settings, standalone_plan
from verl.workers.roles.rollout import RolloutRole, build_rollout_role, evaluating
from verl.workers.update_outcome.result import UpdateResult

logger = logging.getLogger(__name__)


def choose_device(device: str) -> str:
    """The device this worker computes on: ``device`` (the run plan's, ``trainer.device`` as the driver resolved it),
    ``auto`` resolved in this process.

    Raises:
        ValueError: ``cuda`` asked for, and this worker sees no CUDA device.
    """
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device=cuda but this worker sees no CUDA device; use trainer.device=cpu or auto.")
    return device


def setup_worker_process(worker: Worker, device: str, backend: str | None = None) -> str:
    """Thread count, torch.distributed (for several ranks; ``backend`` None: NCCL on CUDA, gloo otherwise) and the
    device (see :func:`choose_device`) of a freshly started worker. The process group is the process's: a role
    that shares the process with another (:mod:`verl.single_controller.colocated`) finds it joined already."""
    threads = os.environ.get("VERL_NUM_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    if worker.world_size > 1:
        worker.init_torch_distributed(backend=backend)
    return choose_device(device)


def mixed_backend() -> str | None:
    """The process group of the workers without megatron: NCCL for CUDA tensors and gloo for the CPU ones that
    offloading leaves behind (one kind for every such role, so that they can share a process); None on CPU."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else None


def with_model_copies_in_shm(arr: ActorRolloutRefConfig) -> ActorRolloutRefConfig:
    """The ``actor_rollout_ref`` section ``arr`` with its model's ``path``, ``tokenizer_path`` and
    ``lora_adapter_path`` pointing at their copies in shared memory (verl's ``model.use_shm``;
    :func:`verl.utils.fs.copy_to_shm`: one copy per node, reused by every worker there, held while this process
    lives). Everything the worker loads from the model's directories (actor, reference, rollout engine, tokenizer,
    the tokenizer a checkpoint's export gets) then reads the copies; the critic reads ``critic.model.path`` where
    it is."""
    from verl.models.loading import resolve_model_path
    from verl.utils.fs import copy_to_shm

    model = arr.model
    changes = {"path": copy_to_shm(resolve_model_path(model.path))}
    if model.tokenizer_path:
        changes["tokenizer_path"] = copy_to_shm(resolve_model_path(model.tokenizer_path))
    if model.lora_adapter_path:
        changes["lora_adapter_path"] = copy_to_shm(model.lora_adapter_path)
    return arr.replace(model=model.replace(**changes))


def _process_group():
    return dist.group.WORLD if dist.is_initialized() else None


class SectionWorker(Worker):
    """A worker built from its own config section and the run plan: what its group passes to its constructor
    (:meth:`init_kwargs`), and a worker built from a whole config outside a group (:meth:`from_config`)."""

    @classmethod
    def init_kwargs(cls, config: PPOConfig, plan: RunPlan) -> dict[str, Any]:
        """The constructor's keyword arguments for a run of ``config`` following ``plan``: the worker's section,
        the plan, and what else it reads from other sections."""
        raise NotImplementedError

    @classmethod
    def from_config(cls, config: PPOConfig, total_training_steps: int | None = None):
        """A worker built outside a worker group (a test, a script): the plan is
        :func:`~verl.workers.config.plan.standalone_plan` (``auto`` resolved on this process's devices), with
        ``total_training_steps`` when given (None: ``trainer.total_training_steps``)."""
        return cls(**cls.init_kwargs(config, standalone_plan(config, total_training_steps)))


class _ModelWorker(SectionWorker):
    """What both workers share: their section, the plan, the profiler, checkpoint plumbing (rank 0 writes the
    model).

    Args:
        config: the worker's own config section.
        plan: the run plan (the device, the passes a step runs; its ``total_training_steps`` sizes the LR schedule).
        profiler: the profiler settings of the worker's role (None: never profiled).
    """

    #: the worker group's role name, as ``PPOConfig.profiler_sections`` names it
    ROLE = ""

    def __init__(self, config: Any, plan: RunPlan, *, profiler: RoleProfilerSettings | None = None):
        super().__init__()
        self.config = config
        self.plan = plan
        self.total_training_steps = plan.total_training_steps
        self._profiler_settings = profiler if profiler is not None else RoleProfilerSettings()
        self._role_profiler = None

    @classmethod
    def init_kwargs(cls, config: PPOConfig, plan: RunPlan) -> dict[str, Any]:
        return {"config": cls._section(config), "plan": plan, "profiler": role_profiler_settings(config, cls.ROLE)}

    @classmethod
    def _section(cls, config: PPOConfig) -> Any:
        """The worker's own section of ``config``."""
        return getattr(config, cls.ROLE)

    def _trained(self):
        raise NotImplementedError

    @property
    def profiler(self):
        """This rank's :class:`~verl.utils.profiler.RoleProfiler` (inactive unless its role's sections ask)."""
        if self._role_profiler is None:
            from verl.utils.profiler import RoleProfiler

            settings = self._profiler_settings
            self._role_profiler = RoleProfiler(
                self.ROLE, list(settings.sections), settings.global_profiler, self.rank, rollout=settings.rollout
            )
        return self._role_profiler

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[Any]:
        """One pass of this worker (``gen``, ``old_log_prob``, ``ref``, ``update_actor``, ``export_weights``,
        ``values``, ``update_critic``, ``checkpoint``): what the pass needs placed for it by the backend
        (:meth:`_placed_for`), and the profiler's labelled range. Every pass a registered method runs goes through
        here, so a backend changes what happens around every pass by overriding one method. Yields what the profiler
        hands the pass: for ``gen``, the :class:`~verl.utils.profiler.TokenWindow` the rollout calls between two
        tokens when its trace spans a token window; None otherwise."""
        with self._placed_for(name), self.profiler.phase(name) as tokens:
            yield tokens

    def _placed_for(self, name: str) -> contextlib.AbstractContextManager:
        """What the backend does around the pass ``name`` (megatron: brings its offloaded parts to the device and
        moves them out after); nothing here."""
        return contextlib.nullcontext()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_profile(self, step: int) -> None:
        """Open the profiling window that starts at training step ``step`` (global_profiler.steps)."""
        self.profiler.start(step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_profile(self, last: bool = False) -> list[str]:
        """Close the profiling window; returns the files this rank wrote. ``last``: the run's last window, after which
        ``finish_hook_cmd`` runs."""
        return self.profiler.stop(last)

    def _model_parallel_size(self) -> int:
        """Over how many ranks one copy of the trained model is split (1 here; megatron: tensor-parallel ranks x
        pipeline stages)."""
        return 1

    def _checkpoint_is_collective(self) -> bool:
        """Whether every rank takes part in saving the trained model (its parts, or its optimizer state, are spread
        over the ranks), or rank 0 writes it alone."""
        return self._model_parallel_size() > 1

    def data_parallel_layout(self) -> tuple[int, bool]:
        """(this rank's data-parallel rank, whether it returns its group's results); called by the driver after
        ``init_model``. Here every rank holds a whole model and is a data-parallel rank of its own; a backend that
        splits a model over ranks says which ranks share rows and which of them returns the results."""
        return self.rank, True

    def _dp_size(self) -> int:
        """How many data-parallel ranks split a batch (the world, unless a model is split over ranks)."""
        return self.world_size // self._model_parallel_size()

    def _device(self) -> str:
        return next(self._trained().model_module().parameters()).device.type

    def _save_extras(self, directory: Path) -> None:
        """Rank 0's additions to a checkpoint beyond the model's own files (none here)."""

    def _save_rank_state(self, directory: Path) -> None:
        """Per-rank random state (each rank samples differently); subclasses add what they own."""
        save_state(rng_state_path(directory, self.rank), self._rank_state())

    def _rank_state(self) -> dict:
        return {"torch": torch.get_rng_state()}

    def _load_rank_state(self, directory: Path) -> None:
        path = rng_state_path(directory, self.rank)
        if not path.is_file():
            logger.warning(
                "%s has no random state for rank %d: sampling continues from fresh seeds", directory, self.rank
            )
            return
        self._restore_rank_state(load_state(path))

    def _restore_rank_state(self, state: dict) -> None:
        torch.set_rng_state(state["torch"])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> None:
        """Rank 0 writes the model and its training state (data-parallel ranks hold identical copies), or every rank
        of a model split over ranks, or of an optimizer that shards its state, its part (a collective, see
        :mod:`verl.workers.actor.megatron_checkpoint`); every rank writes its own random state."""
        with self.phase("checkpoint"):
            self._save_checkpoint(Path(directory))

    def _save_checkpoint(self, directory: Path) -> None:
        if self.rank == 0 or self._checkpoint_is_collective():
            self._trained().save_checkpoint(directory)
        if self.rank == 0:
            self._save_extras(directory)
        if dist.is_initialized():
            dist.barrier()  # the directory exists once rank 0 is through
        directory.mkdir(parents=True, exist_ok=True)
        self._save_rank_state(directory)
        if dist.is_initialized():
            dist.barrier()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, directory: str) -> None:
        """Load the trained model, its training state and this rank's random state from ``directory``."""
        with self.phase("checkpoint"):
            self._load_checkpoint(Path(directory))

    def _load_checkpoint(self, directory: Path) -> None:
        self._trained().load_checkpoint(str(directory))
        self._load_rank_state(directory)


class ActorRolloutRefWorker(_ModelWorker):
    """Actor + rollout + (optional) reference on one rank. Subclasses implement :meth:`_build_actor`.

    Args:
        config: the ``actor_rollout_ref`` section.
        plan: the run plan (which passes run, the device, the step count that sizes the LR schedule).
        profiler: the profiler settings of the actor group (the actor's and the reference's sections).
    """

    ROLE = "actor_rollout_ref"

    def __init__(self, config: ActorRolloutRefConfig, plan: RunPlan, *, profiler: RoleProfilerSettings | None = None):
        super().__init__(config, plan, profiler=profiler)
        self.actor: BasePPOActor | None = None
        self.ref: BasePPOActor | None = None
        self.rollout_role: RolloutRole | None = None  # None: no rollout here (a group of its own samples)
        self.num_weight_syncs = 0

    @property
    def rollout(self):
        """The rollout engine of the hosted :class:`~verl.workers.roles.rollout.RolloutRole` (None without one)."""
        return None if self.rollout_role is None else self.rollout_role.engine

    @rollout.setter
    def rollout(self, engine) -> None:
        # tools and tests put a stand-in in the engine's place (a recording wrapper), or drop it (None)
        if engine is None:
            self.rollout_role = None
        else:
            self.rollout_role.engine = engine

    def _build_actor(self, actor_config: ActorConfig, device: str, trainable: bool) -> BasePPOActor:
        """Build the backend's actor (``trainable=False``: a frozen reference without optimizer)."""
        raise NotImplementedError

    def _trained(self) -> BasePPOActor:
        return self.actor

    def _save_extras(self, directory: Path) -> None:
        """The tokenizer next to a Hugging Face export (``huggingface/``), so that the export is a complete model
        directory."""
        from verl.utils.fsdp_checkpoint import HF_EXPORT_DIR

        export = directory / HF_EXPORT_DIR
        if export.is_dir():
            from verl.models.loading import load_tokenizer

            model = self.config.model
            load_tokenizer(model.tokenizer_path or model.path, model.trust_remote_code).save_pretrained(export)

    # ------------------------------------------------------------------ set-up

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> str:
        """Join torch.distributed, build actor, reference and rollout (none when the rollout has a worker group of
        its own); returns a one-line description."""
        device = setup_worker_process(self, self.plan.device, mixed_backend())  # megatron: joined by then
        if self.config.model.use_shm:
            self.config = with_model_copies_in_shm(self.config)
        arr = self.config
        torch.manual_seed(arr.actor.seed)
        actor_config = arr.actor.per_rank(self.plan.rollout_n, self._dp_size())
        self.actor = self._build_actor(actor_config, device, trainable=True)
        self.actor.model_module().train()
        if self.plan.needs_reference:
            self.ref = self._build_reference(actor_config, device)
        if self.plan.separate_rollout:  # the rollout runs in a worker group of its own (RolloutWorker)
            return f"rank {self.rank}: {type(self.actor).__name__} ({getattr(self.actor, 'training_path', device)})"
        self.rollout_role = self._build_rollout()
        if self._rollout_holds_weights():
            # the engine loaded model.path (or random weights, load_format=dummy); the actor may start elsewhere: an
            # adapter (model.lora_adapter_path, megatron LoRA with a non-zero B init), a megatron dist checkpoint.
            # Its weights go in before any use.
            self._sync_rollout_weights()
        return (
            f"rank {self.rank}: {type(self.actor).__name__} ({getattr(self.actor, 'training_path', device)}), "
            f"rollout {arr.rollout.name}"
        )

    def _build_rollout(self) -> RolloutRole:
        """The rollout over the actor (see :func:`~verl.workers.roles.rollout.build_rollout_role`)."""
        return build_rollout_role(self.config, self.actor, self._device(), self._rollout_seed_offset())

    def _build_reference(self, actor_config: ActorConfig, device: str):
        """The frozen reference policy: a LoRA actor's own model with its adapters off (no second copy, see
        :class:`~verl.utils.lora.AdaptersOffReference`), else a frozen copy built by the backend."""
        if self.actor.adapters_off() is not None:
            from verl.utils.lora import AdaptersOffReference

            return AdaptersOffReference(self.actor)
        ref = self.config.ref
        ref_config = actor_config.replace(
            use_torch_compile=ref.use_torch_compile,
            entropy_from_logits_with_chunking=ref.entropy_from_logits_with_chunking,
        )
        return self._build_actor(ref_config, device, trainable=False)

    def _rollout_seed_offset(self) -> int:
        """The rollout's seed offset: a vLLM engine's index (the ranks of one tensor-parallel engine send it the
        same requests), else this rank's data-parallel rank."""
        from verl.workers.rollout.vllm_engine import engine_index

        rollout = self.config.rollout
        return engine_index(rollout, self.rank) if rollout.name == "vllm" else self.data_parallel_layout()[0]

    # ------------------------------------------------------------------ the RL step

    def _at_rollout_temperature(self, data: DataProto) -> DataProto:
        """``data`` (the same tensors) with ``meta_info["temperature"]``: the caller's (the temperature a per-call
        override sampled at) or else the configured one; the actor has no default of its own."""
        configured = self.config.rollout.temperature
        meta_info = {**data.meta_info, "temperature": data.meta_info.get("temperature", configured)}
        return DataProto(batch=data.batch, non_tensor_batch=data.non_tensor_batch, meta_info=meta_info)

    def _generate(self, prompts: DataProto) -> DataProto:
        """The rollout's output, tagged with the temperature it sampled at (the prompts' override, else the
        configured one)."""
        with self.phase("gen") as tokens:
            return self.rollout_role.generate(prompts, on_token=tokens)

    def _old_log_probs(self, data: DataProto) -> torch.Tensor:
        batching = self.config.rollout.log_prob_micro_batching()
        with self.phase("old_log_prob"), evaluating(self.actor.model_module()):
            return self.actor.compute_log_prob(self._at_rollout_temperature(data.to(self._device())), batching)[0]

    def _ref_log_probs(self, data: DataProto) -> torch.Tensor:
        if self.ref is None:
            raise ValueError("No reference model: set actor_rollout_ref.ref.enable=true (or use_kl_loss=true).")
        batching = self.config.ref.log_prob_micro_batching()
        with self.phase("ref"), evaluating(self.ref.model_module()):
            return self.ref.compute_log_prob(self._at_rollout_temperature(data.to(self._device())), batching)[0]

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses to ``prompts``; the output's ``meta_info["temperature"]`` is the one they were sampled at."""
        return self._generate(prompts).to("cpu")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_tokens(self, requests: DataProto) -> DataProto:
        """Answers to agent loops' token-id requests (one row each: new ``token_ids``, their ``log_probs``, a
        ``finish_reason``), from this rank's rollout in one batched generation; see
        :mod:`verl.workers.rollout.token_requests`."""
        with self.phase("gen") as tokens:
            return self.rollout_role.generate_tokens(requests, on_token=tokens).to("cpu")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def release_rollout(self) -> None:
        """The agent loops of a batch are done: an engine kept awake between their turns sleeps again."""
        self.rollout_role.release()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` (B, R) of the responses at their sampling temperature (meta_info's, else the config's)."""
        return DataProto.from_dict(tensors={"old_log_probs": self._old_log_probs(data).cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` (B, R) of the responses under the reference, at their sampling temperature."""
        return DataProto.from_dict(tensors={"ref_log_prob": self._ref_log_probs(data).cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_with_log_probs(self, prompts: DataProto) -> DataProto:
        """:meth:`generate_sequences`, then the old and the reference log-probs the run needs, in one call.

        The trainer's rollout phase: one round trip instead of up to three, and the responses never leave the
        worker between the passes. The old log-probs come when the run computes them
        (:attr:`~verl.workers.config.plan.RunPlan.computes_old_log_prob`), the reference's when it has one.

        Returns:
            The rollout output plus ``old_log_probs`` and ``ref_log_prob`` (B*n, R) as configured; its
            ``meta_info["timing_s"]`` holds this rank's seconds per pass (``gen``, ``old_log_prob``, ``ref``).
        """
        start = time.perf_counter()
        output = self._generate(prompts)  # tagged with its sampling temperature
        return self._add_log_probs(output, {"timing_s/gen": time.perf_counter() - start})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def add_log_probs(self, generated: DataProto) -> DataProto:
        """The old and the reference log-probs the run needs, added to a batch generated elsewhere (by the rollout
        worker group of its own): the second half of :meth:`generate_with_log_probs`, with its return value.
        The batch is sampled at ``meta_info["temperature"]``, else the configured one."""
        return self._add_log_probs(generated, {})

    def _add_log_probs(self, output: DataProto, timing: dict[str, float]) -> DataProto:
        passes = [("old_log_prob", "old_log_probs", self.plan.computes_old_log_prob, self._old_log_probs)]
        passes.append(("ref", "ref_log_prob", self.plan.needs_reference, self._ref_log_probs))
        for phase, key, wanted, compute in passes:
            if wanted:
                start = time.perf_counter()
                output.batch[key] = compute(output)
                timing[f"timing_s/{phase}"] = time.perf_counter() - start
        output = output.to("cpu")
        output.meta_info["metrics"] = timing
        return output

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> UpdateResult:
        """Train the actor on this rank's rows at their sampling temperature; a rollout holding its own weights gets
        the new ones when the step applied an update (``result.updated``).

        Returns:
            The actor's :class:`~verl.workers.update_outcome.UpdateResult`, its ``actor/...`` metrics joined by
            ``timing_s/weight_sync`` (seconds spent sending weights, 0 when every update of the step was skipped and
            nothing was sent) and ``rollout/weight_syncs`` (syncs so far) when the rollout holds its own weights;
            and ``perf/cpu_peak_rss_gb``, this worker process's peak resident memory so far (GiB, Linux
            ``ru_maxrss``; the driver averages it over ranks).
        """
        with self.phase("update_actor"):  # the sync too: it reads the weights where the update left them
            result = self.actor.update_policy(self._at_rollout_temperature(data.to(self._device())))
            extra = {"perf/cpu_peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
            if self._rollout_holds_weights():
                seconds = 0.0
                if result.updated:
                    seconds = self._sync_rollout_weights()
                    self.num_weight_syncs += 1
                extra["timing_s/weight_sync"] = seconds
                extra["rollout/weight_syncs"] = float(self.num_weight_syncs)
        return result.with_metrics(extra)

    # ------------------------------------------------------------------ weights of a rollout with its own copy

    def _rollout_holds_weights(self) -> bool:
        return self.rollout_role is not None and self.rollout_role.holds_weights

    def _iter_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The actor's current weights as ``(Hugging Face name, tensor)`` pairs, one at a time.

        The default serves a Hugging Face module (the ``dp`` backend): its own state dict, whose tensors are the
        parameters themselves, so nothing is copied. A backend whose module is not a plain Hugging Face model
        overrides it: megatron converts its GPTModel's names and fused layouts layer by layer; FSDP2 should yield
        each parameter's full tensor (``DTensor.full_tensor()``, a collective every rank runs in the same order),
        one at a time, never the gathered model at once. The consumer copies each tensor before asking for the
        next, so a yielded tensor may be freed or reused right after.
        """
        yield from self.actor.model_module().state_dict().items()

    def _rollout_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What a rollout samples with: :meth:`_iter_hf_weights`, and for a LoRA actor the merged weights under the
        plain model's names. Call under ``torch.no_grad()``."""
        weights = self._iter_hf_weights()
        if self.actor.peft_model is not None:
            from verl.utils.lora import lora_scalings, merged_lora_weights

            weights = merged_lora_weights(weights, lora_scalings(self.actor.model_module()))
        return weights

    def _sync_rollout_weights(self) -> float:
        """Send the actor's weights into the rollout; returns the seconds it took."""
        return self.rollout_role.load_weights(self._rollout_weights())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_weights(self) -> list | None:
        """The actor's weights for a rollout worker group of its own, on rank 0: a copy packed into CPU buckets of
        ``rollout.checkpoint_engine.update_weights_bucket_megabytes`` (:func:`verl.utils.weight_buckets.pack_buckets`,
        Hugging Face names, LoRA merged; ``named_tensors`` unpacks them), whose bytes cross Ray without a copy into
        the pickle stream (``benchmarks/bench_weight_transfer.py``). None on the other ranks, which take part in the
        gathers of a sharded model (FSDP2's shards; megatron's tensor-parallel shards and pipeline stages). A pass of
        its own (``export_weights``): the parameters are where the passes read them (megatron brings offloaded ones
        back for it)."""
        from verl.utils.weight_buckets import MIB, pack_buckets

        megabytes = self.config.rollout.checkpoint_engine.update_weights_bucket_megabytes
        with self.phase("export_weights"), torch.no_grad():
            if self.rank == 0:
                return pack_buckets(self._rollout_weights(), megabytes * MIB)
            for _ in self._rollout_weights():  # the gathers run on every rank; only rank 0 keeps the weights
                pass
        return None

    # ------------------------------------------------------------------ checkpoint state of this rank

    def _rank_state(self) -> dict:
        # the sync count continues across a resume, as the metric rollout/weight_syncs of an uninterrupted run would
        rollout = {} if self.rollout_role is None else self.rollout_role.state_dict()
        return {**super()._rank_state(), "rollout": rollout, "weight_syncs": self.num_weight_syncs}

    def _restore_rank_state(self, state: dict) -> None:
        super()._restore_rank_state(state)
        if self.rollout_role is not None:
            self.rollout_role.load_state_dict(state["rollout"])
        self.num_weight_syncs = int(state.get("weight_syncs", 0))  # absent in checkpoints of older versions

    def _load_checkpoint(self, directory: Path) -> None:
        """Load the checkpoint; a rollout holding its own weights gets the loaded ones (not counted as a step's
        sync in ``rollout/weight_syncs``)."""
        super()._load_checkpoint(directory)
        if self._rollout_holds_weights():
            self._sync_rollout_weights()


class CriticWorker(_ModelWorker):
    """The critic on one rank. Subclasses implement :meth:`_build_critic`.

    It starts from the actor's model (``actor_rollout_ref.model.path``) with a fresh value head, trains with its own
    optimizer, schedule and update-failure policy (``critic.update_failure_policy``, role "critic"), and checkpoints
    next to the actor.

    Args:
        config: the ``critic`` section.
        plan: the run plan (the device, the step count, the responses per prompt that size its mini-batches).
        profiler: the profiler settings of the critic group.
    """

    ROLE = "critic"

    def __init__(self, config: CriticConfig, plan: RunPlan, *, profiler: RoleProfilerSettings | None = None):
        super().__init__(config, plan, profiler=profiler)
        self.critic = None

    def _build_critic(self, critic_config: CriticConfig, device: str):
        raise NotImplementedError

    def _trained(self):
        return self.critic

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> str:
        device = setup_worker_process(self, self.plan.device, mixed_backend())  # megatron: joined by then
        torch.manual_seed(self.config.seed)
        self.critic = self._build_critic(self.config.per_rank(self.plan.rollout_n, self._dp_size()), device)
        self.critic.model_module().train()
        return f"rank {self.rank}: {type(self.critic).__name__} ({getattr(self.critic, 'training_path', device)})"

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        with self.phase("values"), evaluating(self.critic.model_module()):
            values = self.critic.compute_values(data.to(self._device()))
        return DataProto.from_dict(tensors={"values": values.cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> UpdateResult:
        """Train the critic on this rank's rows; returns its :class:`~verl.workers.update_outcome.UpdateResult`."""
        with self.phase("update_critic"):
            return self.critic.update_critic(data.to(self._device()))
