"""The device rule: ``trainer.device`` (``auto`` by default) decided once on the cluster's GPUs, and the one
start-up line that says where the run trains (verl/workers/config/plan.py, issue 47 item 1)."""

import dataclasses

import pytest

from verl.workers.config import build_run_plan, compose_ppo_config
from verl.workers.config.plan import device_summary, gpus_needed, resolve_device

TWO_RANKS = ["trainer.n_gpus_per_node=2"]
# a rollout group of its own: 2 trainer ranks + 2 rollout ranks, 16 prompts a step split over both groups
SEPARATE_ROLLOUT = [*TWO_RANKS, "actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=2"]


def resolved(device: str, gpus: int, *overrides: str):
    """(plan resolved on a cluster of ``gpus`` GPUs, the config) for ``trainer.device=<device>``."""
    config = compose_ppo_config([f"trainer.device={device}", *TWO_RANKS, *overrides])
    return resolve_device(build_run_plan(config), config, gpus), config


def test_a_cuda_run_places_one_gpu_per_rank_and_the_rollout_group_its_own():
    # 1 node x 2 ranks = 2; with a rollout group of its own, + 1 x 2 rollout ranks = 4
    assert gpus_needed(compose_ppo_config(TWO_RANKS)) == 2
    assert gpus_needed(compose_ppo_config(SEPARATE_ROLLOUT)) == 4


def test_auto_on_a_cluster_without_gpus_trains_on_cpu_processes():
    plan, config = resolved("auto", 0)
    assert plan.device == "cpu"
    assert plan == dataclasses.replace(build_run_plan(config), device="cpu")  # nothing else changes
    assert device_summary(plan, config, 0) == "training on 2 CPU processes: no GPU in the cluster"


@pytest.mark.parametrize("gpus", [2, 8])  # exactly one per rank, or more than enough
def test_auto_with_a_gpu_for_every_rank_trains_on_them(gpus):
    plan, config = resolved("auto", gpus)
    assert plan.device == "cuda"
    assert device_summary(plan, config, gpus) == "training on 2 GPUs"


def test_auto_with_some_gpus_but_too_few_is_an_error_naming_the_sizes_not_a_silent_cpu_run():
    with pytest.raises(ValueError, match=r"places 2 rank\(s\).*trainer\.n_gpus_per_node=2.*has 1 GPU.*device=cpu"):
        resolved("auto", 1)


def test_the_rollout_group_of_its_own_counts_in_the_gpus_asked_for():
    with pytest.raises(ValueError, match=r"places 4 rank\(s\).*rollout\.n_gpus_per_node=2.*has 3 GPU"):
        resolved("auto", 3, *SEPARATE_ROLLOUT[1:])
    plan, config = resolved("auto", 4, *SEPARATE_ROLLOUT[1:])
    assert (plan.device, device_summary(plan, config, 4)) == ("cuda", "training on 4 GPUs")


def test_cuda_without_a_gpu_is_an_error_naming_the_key_and_the_other_values():
    with pytest.raises(ValueError, match=r"trainer\.device=cuda, but the Ray cluster has no GPU.*auto.*cpu"):
        resolved("cuda", 0)
    with pytest.raises(ValueError, match=r"trainer\.device=cuda: the run places 2 rank\(s\).*has 1 GPU"):
        resolved("cuda", 1)
    assert resolved("cuda", 2)[0].device == "cuda"


def test_cpu_is_taken_as_given_and_the_line_names_the_gpus_left_unused():
    plan, config = resolved("cpu", 8)
    assert plan.device == "cpu"
    assert device_summary(plan, config, 8) == (
        "training on 2 CPU processes: trainer.device=cpu (the cluster's 8 GPU(s) stay unused)"
    )
    assert device_summary(plan, config, 0) == "training on 2 CPU processes: trainer.device=cpu"


def test_one_rank_is_singular_in_the_line():
    config = compose_ppo_config(["trainer.device=auto"])  # the embedded run: 1 node x 1 rank
    plan = resolve_device(build_run_plan(config), config, 0)
    assert device_summary(plan, config, 0) == "training on 1 CPU process: no GPU in the cluster"


def test_auto_resolved_to_cpu_checks_the_cuda_only_settings_again():
    # nsys captures CUDA ranges: refused on cpu when the config was validated; with auto only once it is cpu
    nsys = ["global_profiler.tool=nsys", "global_profiler.steps=[1]", "actor_rollout_ref.actor.profiler.enable=true"]
    config = compose_ppo_config(["trainer.device=auto", *nsys])
    with pytest.raises(ValueError, match="tool nsys needs CUDA"):
        resolve_device(build_run_plan(config), config, 0)
    assert resolve_device(build_run_plan(config), config, 1).device == "cuda"
