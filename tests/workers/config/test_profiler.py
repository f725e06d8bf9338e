"""Tests for verl.workers.config.profiler: verl's profiler keys compose from profiler/profiler.yaml and validate; the
rules that span sections refuse what nothing would read, by the full key and with the reason."""

import pytest

from verl.workers.config import compose_ppo_config
from verl.workers.config.plan import role_profiler_settings

A = "actor_rollout_ref.actor.profiler"
R = "actor_rollout_ref.rollout.profiler"
ON = ["global_profiler.tool=torch", "global_profiler.steps=[1,2]"]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ([f"{A}.enable=true"], r"actor.profiler.enable=true, but global_profiler.tool is null"),
        (["global_profiler.tool=npu", "global_profiler.steps=[1]"], r"global_profiler.tool='npu' asks for Ascend"),
        (["global_profiler.tool=torch"], r"global_profiler.steps=None: list the training steps"),
        (["global_profiler.tool=vtune", "global_profiler.steps=[1]"], r"'vtune' is not a profiler here"),
        (
            ["global_profiler.tool=nsys", "global_profiler.steps=[1]", f"{A}.enable=true", "trainer.device=cpu"],
            r"tool nsys needs CUDA \(Nsight Systems captures CUDA ranges\); on CPU use global_profiler.tool=torch",
        ),
        (
            [f"{A}.tool_config.torch.schedule.wait=-1"],
            rf"^{A}\.tool_config\.torch\.schedule\.wait must be an integer >= 0, got -1",
        ),
        ([f"{A}.tool_config.torch.contents=[cpu,gpu]"], rf"^{A}\.tool_config\.torch\.contents=.*'gpu' is not one of"),
        (
            [f"{R}.tool_config.torch.profile_token_start=8", f"{R}.tool_config.torch.profile_token_end=8"],
            rf"^{R}\.tool_config\.torch\.profile_token_end=8 must be above profile_token_start=8",
        ),
        (["global_profiler.finish_hook_ranks=[-1]"], r"global_profiler.finish_hook_ranks must hold integers >= 0"),
    ],
)
def test_bad_profiling_settings_fail_at_start_up(overrides, match):
    with pytest.raises(ValueError, match=match):
        compose_ppo_config(overrides)


def test_verls_torch_profile_script_keys_compose_with_verls_meaning():
    # examples/profile/run_qwen2_5_7b_torch_profile.sh's profiler keys (its vLLM rollout is the naive one here)
    torch_keys = [f"{A}.tool_config.torch.schedule.{k}=0" for k in ("active", "skip_first", "wait", "warmup", "repeat")]
    config = compose_ppo_config(
        [
            *ON,
            f"{A}.enable=True",
            f"{A}.ranks=[0]",
            f"{A}.all_ranks=False",
            f"{A}.tool_config.torch.discrete=False",
            f"{A}.tool_config.torch.contents=['cpu','cuda']",
            *torch_keys,
            f"{R}.enable=True",
            f"{R}.ranks=[0]",
            f"{R}.all_ranks=False",
            f"{R}.tool_config.torch.discrete=True",
            f"{R}.tool_config.torch.contents=['cpu','cuda']",
            f"{R}.tool_config.torch.profile_token_start=null",
            f"{R}.tool_config.torch.profile_token_end=null",
            "global_profiler.save_path=/tmp/profile",
            "global_profiler.relocate_results=True",
            "global_profiler.finish_hook_cmd=null",
        ]
    )
    actor, rollout = config.actor_rollout_ref.actor.profiler, config.actor_rollout_ref.rollout.profiler
    assert not actor.tool_config.torch.schedule.enabled  # active 0: the whole update is recorded
    assert rollout.tool_config.torch.discrete and rollout.tool_config.torch.token_window is None
    assert config.global_profiler.relocate_results and config.global_profiler.finish_hook_cmd is None
    # the actor worker hosts the rollout: its settings carry the rollout's section next to the actor's
    settings = role_profiler_settings(config, "actor_rollout_ref")
    assert settings.sections == (actor,) and settings.rollout is rollout and settings.enabled
    assert [key for key, _ in config.profiler_sections()["actor_rollout_ref"]] == [A, R]


def test_the_rollouts_section_follows_the_actors_as_in_verl():
    actor = [
        f"{A}.enable=true",
        f"{A}.ranks=[0,3]",
        f"{A}.tool_config.torch.discrete=true",
        f"{A}.tool_config.torch.contents=[cpu,shapes]",
    ]
    rollout = compose_ppo_config([*ON, *actor]).actor_rollout_ref.rollout.profiler
    assert (rollout.enable, rollout.ranks, rollout.tool_config.torch.discrete) == (True, [0, 3], True)
    assert rollout.tool_config.torch.contents == ["cpu", "shapes"]
    # set on its own, it keeps its value
    rollout = compose_ppo_config([*ON, *actor, f"{R}.ranks=[1]"]).actor_rollout_ref.rollout.profiler
    assert rollout.ranks == [1] and rollout.tool_config.torch.discrete


def test_a_token_window_is_read_by_the_naive_and_hf_rollouts_only():
    window = [
        *ON,
        f"{R}.enable=true",
        f"{R}.tool_config.torch.discrete=true",
        f"{R}.tool_config.torch.profile_token_start=4",
        f"{R}.tool_config.torch.profile_token_end=12",
    ]
    torch_config = compose_ppo_config(window).actor_rollout_ref.rollout.profiler.tool_config.torch
    assert torch_config.token_window == (4, 12)
    hf = [*window, "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.strategy=dp"]
    assert compose_ppo_config(hf).actor_rollout_ref.rollout.name == "hf"
    # end alone: from the first token
    config = compose_ppo_config([*window[:-2], f"{R}.tool_config.torch.profile_token_end=3"])
    assert config.actor_rollout_ref.rollout.profiler.tool_config.torch.token_window == (0, 3)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            ["actor_rollout_ref.rollout.name=vllm", f"{R}.enable=true", f"{R}.tool_config.torch.discrete=true"],
            rf"^{R}\.tool_config\.torch\.profile_token_start=4: the vllm rollout generates a whole batch inside its "
            r"engine",
        ),
        (
            [f"{R}.enable=true"],  # not discrete: generation stays in the window, nothing reads the window of tokens
            rf"^{R}\.tool_config\.torch\.profile_token_start=4: the token window cuts the rollout's own torch trace",
        ),
    ],
)
def test_a_token_window_nothing_reads_is_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        compose_ppo_config([*ON, f"{R}.tool_config.torch.profile_token_start=4", *overrides])


def test_the_rollouts_traces_need_it_in_the_actor_worker_and_no_schedule():
    with pytest.raises(ValueError, match=rf"^{R}\.tool_config\.torch\.schedule\.active=2: the schedule steps"):
        compose_ppo_config([*ON, f"{R}.tool_config.torch.schedule.active=2"])
    separate = [
        "actor_rollout_ref.hybrid_engine=false",
        "actor_rollout_ref.rollout.n=2",
        "rollout.nnodes=1",
        "rollout.n_gpus_per_node=1",
    ]
    with pytest.raises(ValueError, match=rf"^{R}\.enable=true with discrete traces and hybrid_engine=false"):
        compose_ppo_config([*ON, *separate, f"{R}.enable=true", f"{R}.tool_config.torch.discrete=true"])
