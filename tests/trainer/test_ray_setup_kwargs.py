"""verl's ``ray_kwargs`` reach Ray: ``ray_kwargs.ray_init.*`` as ``ray.init``'s keyword arguments over this project's
own, and Ray's timeline written to ``ray_kwargs.timeline_json_file`` (verl/trainer/ray_setup.py)."""

import json
import sys

import pytest

from verl.trainer import ray_setup
from verl.trainer.ray_setup import ray_init_kwargs, start_ray, write_timeline
from verl.workers.config import compose_ppo_config


def ray_init_calls(monkeypatch) -> list[dict]:
    """``ray.init`` replaced by a recorder of its keyword arguments (Ray is never started); replace it after the
    config is composed, whose check reads the real ``ray.init``'s signature."""
    import ray

    calls: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    return calls


def test_ray_kwargs_ray_init_reach_ray_init_over_the_projects_own(monkeypatch):
    config = compose_ppo_config(
        [
            "ray_kwargs.ray_init.num_cpus=3",
            "+ray_kwargs.ray_init.namespace=verl",
            f"ray_kwargs.ray_init.runtime_env.py_executable={sys.executable}",
            "+ray_kwargs.ray_init.runtime_env.env_vars={HF_HOME: /hf}",
        ]
    )
    calls = ray_init_calls(monkeypatch)
    start_ray(config)
    (kwargs,) = calls
    assert (kwargs["address"], kwargs["num_cpus"], kwargs["namespace"]) == ("local", 3, "verl")
    runtime_env = kwargs["runtime_env"]
    assert runtime_env["py_executable"] == sys.executable
    # the user's variable beside the project's own (the workers' import path and thread count)
    assert runtime_env["env_vars"]["HF_HOME"] == "/hf" and "PYTHONPATH" in runtime_env["env_vars"]
    assert kwargs["include_dashboard"] is False and kwargs["_system_config"] == {"worker_niceness": 0}


def test_the_older_ray_init_section_still_sizes_ray(monkeypatch):
    config = compose_ppo_config(["ray_init.num_cpus=2"])
    calls = ray_init_calls(monkeypatch)
    start_ray(config)
    assert (calls[0]["address"], calls[0]["num_cpus"]) == ("local", 2)
    assert "py_executable" not in calls[0]["runtime_env"]  # verl's null: this Python


def test_the_two_sections_disagreeing_is_refused_when_the_config_is_validated():
    with pytest.raises(ValueError, match=r"ray_init\.num_cpus=2 and ray_kwargs\.ray_init\.num_cpus=4 disagree"):
        compose_ppo_config(["ray_init.num_cpus=2", "ray_kwargs.ray_init.num_cpus=4"])


def test_a_misspelt_ray_init_argument_is_refused_when_the_config_is_validated():
    with pytest.raises(ValueError, match=r"ray_kwargs\.ray_init\.num_gpu is not an argument of ray\.init"):
        compose_ppo_config(["+ray_kwargs.ray_init.num_gpu=0"])


def test_num_cpus_with_an_address_names_the_key_the_user_set():
    config = compose_ppo_config(["ray_init.address=auto", "ray_kwargs.ray_init.num_cpus=2"])
    with pytest.raises(ValueError, match=r"ray_kwargs\.ray_init\.num_cpus=2 sizes a local Ray instance"):
        ray_init_kwargs(config)


def test_a_py_executable_whose_command_is_missing_stops_before_ray_starts(monkeypatch):
    config = compose_ppo_config(["ray_kwargs.ray_init.runtime_env.py_executable='no-such-uv run --frozen'"])
    calls = ray_init_calls(monkeypatch)
    with pytest.raises(ValueError, match=r"'no-such-uv' is not found on this machine.*py_executable=null"):
        start_ray(config)
    assert calls == []


# verl 1dda039's scripts start their workers with this prefix (54 of its example scripts set it)
VERL_UV_RUN = "uv -v run --frozen --all-packages --extra vllm --extra fsdp"


def uv_project(monkeypatch, tmp_path, *, extras: str, lock: bool):
    """The working directory in a uv project of ``extras`` (TOML keys), with or without ``uv.lock``, and a ``uv``
    found on this machine's PATH (none need be installed: nothing runs it)."""
    import shutil

    (tmp_path / "pyproject.toml").write_text(f"[project]\nname = 'p'\n[project.optional-dependencies]\n{extras}\n")
    if lock:
        (tmp_path / "uv.lock").write_text("")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # uv looks for the project at the working directory and above
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda cmd: "/usr/bin/uv" if cmd == "uv" else which(cmd))


def py_executable(prefix: str):
    return compose_ppo_config([f"ray_kwargs.ray_init.runtime_env.py_executable='{prefix}'"])


def test_verls_uv_run_prefix_naming_extras_this_project_lacks_is_refused_before_ray(monkeypatch, tmp_path):
    uv_project(monkeypatch, tmp_path, extras="vllm = []\nmegatron = []", lock=True)
    config = py_executable(VERL_UV_RUN)
    calls = ray_init_calls(monkeypatch)
    with pytest.raises(ValueError, match=r"has no extra fsdp \(its extras: megatron, vllm\).*py_executable=null"):
        start_ray(config)
    assert calls == []


def test_a_frozen_uv_run_without_a_lock_file_is_refused(monkeypatch, tmp_path):
    uv_project(monkeypatch, tmp_path, extras="vllm = []\nfsdp = []", lock=False)
    with pytest.raises(ValueError, match=r"--frozen.*needs .*uv\.lock, which does not exist"):
        ray_init_kwargs(py_executable(VERL_UV_RUN))


def test_a_uv_run_prefix_that_can_start_here_is_passed_to_ray(monkeypatch, tmp_path):
    uv_project(monkeypatch, tmp_path, extras="vllm = []\nFSDP = []", lock=True)  # extra names compare normalised
    assert ray_init_kwargs(py_executable(VERL_UV_RUN))["runtime_env"]["py_executable"] == VERL_UV_RUN


def test_no_timeline_file_writes_nothing(monkeypatch, tmp_path):
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "timeline", lambda filename=None: pytest.fail("timeline asked for"))
    write_timeline(compose_ppo_config())  # timeline_json_file: null


@pytest.mark.slow
def test_the_timeline_is_written_after_a_real_ray_session(tmp_path):
    import ray

    path = tmp_path / "trace" / "timeline.json"
    config = compose_ppo_config(["ray_kwargs.ray_init.num_cpus=1", f"ray_kwargs.timeline_json_file={path}"])
    try:
        start_ray(config)
        assert ray.cluster_resources()["CPU"] == 1  # the kwargs reached the real ray.init
        assert ray_setup.cluster_gpus() == 0 or ray.cluster_resources().get("GPU", 0) >= 1
        ray.get(ray.remote(lambda: 1).remote())
        write_timeline(config)
    finally:
        ray.shutdown()
    events = json.loads(path.read_text())
    assert isinstance(events, list) and events  # Chrome trace events, at least the task above
