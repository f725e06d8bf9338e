"""verl's ``ray_kwargs`` section: its names checked against ``ray.init``, and one request with the older
``ray_init`` section (verl/workers/config/ray_kwargs.py)."""

import pytest

from verl.workers.config.ray_kwargs import RayKwargsConfig, merged_ray_init, runtime_env_over, source_key
from verl.workers.config.schema import build_config


def ray_kwargs(**ray_init) -> RayKwargsConfig:
    return build_config(RayKwargsConfig, {"ray_init": ray_init, "timeline_json_file": None})


class Legacy:
    """The older ``ray_init`` section: address and num_cpus."""

    def __init__(self, address=None, num_cpus=None):
        self.address, self.num_cpus = address, num_cpus


def test_verls_defaults_are_accepted_and_ask_ray_for_nothing_but_a_local_instance():
    verl_default = ray_kwargs(num_cpus=None, runtime_env={"py_executable": None})
    assert merged_ray_init(Legacy(), verl_default) == {"address": None, "num_cpus": None}


def test_a_name_ray_init_does_not_take_is_refused_with_the_nearest_ones():
    with pytest.raises(ValueError, match=r"ray_kwargs\.ray_init\.num_cpu is not an argument of ray\.init.*num_cpus"):
        ray_kwargs(num_cpu=4)
    # every named argument of ray.init, and its private ones (Ray checks those itself), are accepted
    assert ray_kwargs(num_gpus=0, namespace="x", _temp_dir="/tmp/r").ray_init["namespace"] == "x"


@pytest.mark.parametrize(
    "runtime_env, key",
    [("uv", r"ray_init\.runtime_env="), ({"py_executable": 3}, r"runtime_env\.py_executable=3")],
)
def test_a_runtime_env_that_is_not_ray_s_is_refused(runtime_env, key):
    with pytest.raises(ValueError, match=key):
        ray_kwargs(runtime_env=runtime_env)


def test_the_two_sections_are_one_request_and_a_disagreement_names_both_keys():
    # the older section alone, verl's alone, both the same: one value
    assert merged_ray_init(Legacy(num_cpus=2), ray_kwargs())["num_cpus"] == 2
    assert merged_ray_init(Legacy(), ray_kwargs(num_cpus=3))["num_cpus"] == 3
    assert merged_ray_init(Legacy(address="auto"), ray_kwargs(address="auto"))["address"] == "auto"
    with pytest.raises(ValueError, match=r"ray_init\.num_cpus=2 and ray_kwargs\.ray_init\.num_cpus=4 disagree"):
        merged_ray_init(Legacy(num_cpus=2), ray_kwargs(num_cpus=4))
    with pytest.raises(ValueError, match=r"ray_init\.address='auto' and ray_kwargs\.ray_init\.address="):
        merged_ray_init(Legacy(address="auto"), ray_kwargs(address="10.0.0.1:6379"))


def test_the_key_a_setting_came_from_is_the_one_messages_name():
    assert source_key(Legacy(num_cpus=2), ray_kwargs(), "num_cpus") == "ray_init.num_cpus"
    assert source_key(Legacy(), ray_kwargs(num_cpus=2), "num_cpus") == "ray_kwargs.ray_init.num_cpus"


def test_the_users_runtime_env_lies_over_the_projects_key_by_key():
    ours = {"env_vars": {"PYTHONPATH": "/repo", "VERL_NUM_THREADS": "4"}}
    user = {"env_vars": {"VERL_NUM_THREADS": "1", "HF_HOME": "/hf"}, "py_executable": "uv run"}
    merged = runtime_env_over(ours, user)
    assert merged == {
        "env_vars": {"PYTHONPATH": "/repo", "VERL_NUM_THREADS": "1", "HF_HOME": "/hf"},  # the user's value wins
        "py_executable": "uv run",
    }
    assert ours == {"env_vars": {"PYTHONPATH": "/repo", "VERL_NUM_THREADS": "4"}}  # the base is left as it was


def test_py_executable_null_is_left_to_ray_and_a_command_is_passed_on():
    assert "runtime_env" not in merged_ray_init(Legacy(), ray_kwargs(runtime_env={"py_executable": None}))
    command = "uv run --frozen"
    merged = merged_ray_init(Legacy(), ray_kwargs(runtime_env={"py_executable": command}))
    assert merged["runtime_env"] == {"py_executable": command}
