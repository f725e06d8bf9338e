"""verl's component layout of verl/trainer/config: ppo_trainer.yaml composed from one file per section.

What the layout must keep: every key of the single-file config it replaced (keys only added: ``model_engine``); the
derived trainers equal to what they were (ppo_megatron_trainer: actor and critic on megatron, nothing else); verl's
ways of choosing a component (``model_engine=megatron``, ``actor@actor_rollout_ref.actor=megatron_actor``, a config
of one's own naming the components, found through ``hydra.searchpath``); and no default given twice.
"""

import functools
import posixpath
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from verl.workers.config import compose_omegaconf, compose_ppo_config
from verl.workers.config.loading import CONFIG_DIR, load_section
from verl.workers.config.model_engine import check_model_engine
from verl.workers.config.ppo import PPOConfig
from verl.workers.config.roles import ActorConfig, CriticConfig
from verl.workers.config.schema import FieldError

REPO = CONFIG_DIR.parents[2]
# The trainers built on ppo_trainer.yaml: they exist to override its values, so they are not components.
DERIVED_TRAINERS = (
    "ppo_megatron_trainer.yaml",
    "fully_async_ppo_trainer.yaml",
    "one_step_off_ppo_trainer.yaml",
    "fully_async_ppo_megatron_trainer.yaml",
    "one_step_off_ppo_megatron_trainer.yaml",
)
# Every key of the single-file ppo_trainer.yaml the layout replaced (composed before the split, flattened).
KEYS_BEFORE = Path(__file__).with_name("layout_keys_before.txt")
NO_EMBEDDED = "~embedded@_global_"


def flatten(tree, prefix=""):
    """{dotted key: leaf}: lists, scalars and empty mappings are leaves."""
    flat = {}
    for key, value in (tree or {}).items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(flatten(value, dotted))
        else:
            flat[dotted] = value
    return flat


def composed(overrides=(), config_name="ppo_trainer", config_dir=None) -> dict:
    """The flattened composition (unresolved); the package's own files' compositions are shared (read-only)."""
    if config_dir is not None:
        return flatten(OmegaConf.to_container(compose_omegaconf(list(overrides), config_name, config_dir)))
    return _composed(tuple(overrides), config_name)


@functools.cache
def _composed(overrides: tuple, config_name: str) -> dict:
    return flatten(OmegaConf.to_container(compose_omegaconf(list(overrides), config_name), resolve=False))


def differing(left: dict, right: dict) -> set:
    return {key for key in left.keys() | right.keys() if left.get(key, "<absent>") != right.get(key, "<absent>")}


# ---------------------------------------------------------------- what the split kept


@pytest.mark.parametrize("config_name", ["ppo_trainer", "ppo_megatron_trainer"])
def test_every_key_of_the_single_file_config_is_still_composed(config_name):
    before = set(KEYS_BEFORE.read_text().split())
    now = composed([NO_EMBEDDED], config_name)
    assert len(before) == 497  # the leaves of the file the split replaced: a truncated list would prove nothing
    assert sorted(before - set(now)) == []
    assert now["model_engine"] == ("megatron" if config_name == "ppo_megatron_trainer" else "dp")


@pytest.mark.parametrize("model_path", [[], ["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B"]])
def test_megatron_trainer_is_ppo_trainer_with_actor_and_critic_on_megatron(model_path):
    plain, megatron = composed(model_path), composed(model_path, "ppo_megatron_trainer")
    # Before the layout the file set actor and critic strategy to megatron; model_engine is the one key added.
    assert differing(plain, megatron) == {"model_engine", "actor_rollout_ref.actor.strategy", "critic.strategy"}
    assert (megatron["actor_rollout_ref.actor.strategy"], megatron["critic.strategy"]) == ("megatron", "megatron")
    assert megatron == composed([*model_path, "model_engine=megatron"])


@pytest.mark.parametrize("config_name", ["fully_async_ppo_trainer", "one_step_off_ppo_trainer"])
def test_async_trainers_change_exactly_the_keys_their_file_sets(config_name):
    own = yaml.safe_load((CONFIG_DIR / f"{config_name}.yaml").read_text())
    own.pop("defaults")
    model = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B"]  # verl's values (no embedded layer)
    plain, derived = composed(model), composed(model, config_name)
    assert set(derived) == set(plain)
    changed = differing(plain, derived)
    assert changed and changed <= set(flatten(own))
    assert all(derived[key] == value for key, value in flatten(own).items())


@pytest.mark.parametrize("config_name", ["fully_async_ppo_trainer", "one_step_off_ppo_trainer"])
def test_megatron_async_trainers_are_their_trainer_with_model_engine_megatron(config_name):
    # verl's *_megatron_trainer files of its async trainers: the same file with model_engine megatron
    model = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B"]
    assert composed(model, config_name.replace("_ppo_", "_ppo_megatron_")) == composed(
        [*model, "model_engine=megatron"], config_name
    )


# ---------------------------------------------------------------- choosing components as in verl


def test_actor_component_override_is_the_strategy_alone():
    actor = composed(["actor@actor_rollout_ref.actor=megatron_actor"])
    assert actor == composed(["actor_rollout_ref.actor.strategy=megatron"])
    assert actor["model_engine"] == "dp"  # the engine picks the defaults; one component may still be swapped


def test_critic_component_override_is_the_strategy_alone():
    # critic@critic is the group at its own name: Hydra spells its override critic=<option>
    assert differing(composed(), composed(["critic=megatron_critic"])) == {"critic.strategy"}


def test_model_engine_megatron_validates_with_every_role_on_megatron():
    config = compose_ppo_config(["model_engine=megatron"])
    assert config.model_engine == "megatron"
    assert config.actor_rollout_ref.actor.strategy == "megatron"
    assert config.critic.strategy == "megatron"
    assert config.actor_rollout_ref.ref.strategy == "megatron"  # follows the actor's


def test_model_engine_dp_keeps_the_older_strategy_override():
    config = compose_ppo_config(["actor_rollout_ref.actor.strategy=megatron"])
    assert (config.model_engine, config.actor_rollout_ref.actor.strategy) == ("dp", "megatron")


def test_model_engine_megatron_with_an_fsdp_actor_is_a_contradiction():
    with pytest.raises(ValueError, match=r"model_engine=megatron .*actor_rollout_ref\.actor\.strategy=fsdp"):
        compose_ppo_config(["model_engine=megatron", "actor_rollout_ref.actor.strategy=fsdp"])


@pytest.mark.parametrize(("engine", "name"), [("veomni", "VeOmni"), ("torchtitan", "TorchTitan"), ("automodel", "")])
def test_verls_other_engines_are_refused_by_name(engine, name):
    # on the command line: Hydra finds no model_engine/<engine>.yaml, and the refusal says why
    with pytest.raises(ValueError, match=rf"model_engine={engine} asks for .*{name}.*out of scope"):
        compose_ppo_config([f"model_engine={engine}"])
    # set in a YAML file of one's own (no component lookup): the typed config refuses it the same way
    config = compose_omegaconf()
    OmegaConf.update(config, "model_engine", engine)
    with pytest.raises(ValueError, match=rf"^model_engine={engine} asks for .*{name}.*out of scope"):
        PPOConfig.from_omegaconf(config)


def test_an_unknown_engine_lists_the_two_built_here():
    with pytest.raises(FieldError, match=r"model_engine='deepspeed' is not an engine: dp \| megatron"):
        check_model_engine("deepspeed", "fsdp")


# ---------------------------------------------------------------- a config of one's own


def write_config(folder: Path, name: str, searchpath: str, defaults: list, body: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump({"hydra": {"searchpath": [searchpath]}, "defaults": defaults, **body}, sort_keys=False)
    (folder / f"{name}.yaml").write_text(text)
    return folder


SEARCHPATHS = ["pkg://verl.trainer.config", "file://verl/trainer/config"]


@pytest.mark.parametrize("searchpath", SEARCHPATHS)
@pytest.mark.parametrize("cwd", ["repo", "elsewhere"])
def test_own_config_built_on_ppo_trainer_through_the_searchpath(tmp_path, monkeypatch, searchpath, cwd):
    # verl's recipes run from verl's repository, where file://verl/trainer/config is a folder; elsewhere the
    # relative path is taken to mean this package's config folder
    monkeypatch.chdir(REPO if cwd == "repo" else tmp_path)
    defaults = ["ppo_trainer", {"override actor@actor_rollout_ref.actor": "megatron_actor"}, "_self_"]
    folder = write_config(tmp_path / "conf", "mine", searchpath, defaults, {"trainer": {"project_name": "mine"}})
    own = composed(config_name="mine", config_dir=folder)
    # the embedded layer still applies (model path "default"), under the file's own values
    assert own == composed(["actor@actor_rollout_ref.actor=megatron_actor", "trainer.project_name=mine"])
    if (cwd, searchpath) == ("elsewhere", SEARCHPATHS[1]):  # validating once is enough: the compositions are equal
        config = compose_ppo_config(["trainer.total_training_steps=2"], "mine", folder)
        assert (config.trainer.project_name, config.actor_rollout_ref.actor.strategy) == ("mine", "megatron")


@pytest.mark.parametrize("searchpath", SEARCHPATHS)
def test_own_config_naming_every_component(tmp_path, monkeypatch, searchpath):
    monkeypatch.chdir(tmp_path)
    trainer = yaml.safe_load((CONFIG_DIR / "ppo_trainer.yaml").read_text())
    # verl's form: each component named by its file (dp_actor, not ${model_engine}_actor), then the file's own values
    explicit = {f"${{model_engine}}_{role}": f"dp_{role}" for role in ("actor", "ref", "critic")}
    defaults = []
    for entry in trainer.pop("defaults"):
        if isinstance(entry, dict) and "embedded@_global_" in entry:
            continue  # this project's slot for its embedded layer: a config of one's own has none
        if isinstance(entry, dict):
            ((group, option),) = entry.items()
            entry = {group: explicit.get(option, option)}
        defaults.append(entry)
    assert {"actor@actor_rollout_ref.actor": "dp_actor"} in defaults and defaults[-1] == "_self_"
    trainer["trainer"]["project_name"] = "mine"
    folder = write_config(tmp_path / "conf", "mine", searchpath, defaults, trainer)
    assert composed(config_name="mine", config_dir=folder) == composed([NO_EMBEDDED, "trainer.project_name=mine"])
    # verl's values need micro-batch sizes (or token budgets) with a model of one's own
    model = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B", "actor_rollout_ref.actor.use_dynamic_bsz=true"]
    if searchpath == SEARCHPATHS[1]:  # validated once: the two compositions are equal
        assert compose_ppo_config([*model, "trainer.total_training_steps=2"], "mine", folder).model_engine == "dp"


# ---------------------------------------------------------------- no default given twice


def package_header(path: Path) -> str | None:
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            return None
        if line.startswith("# @package "):
            return line.removeprefix("# @package ").strip()
    return None


def join_package(parent: str, child: str) -> str:
    """Hydra's package of a defaults-list entry: relative to the including file's, ``_global_`` the root."""
    if child.startswith("_global_"):
        return child.removeprefix("_global_").lstrip(".")
    return ".".join(part for part in (parent, child) if part)


def mounted_files(config: str, group: str, package: str, engine: str) -> list[tuple[Path, str]]:
    """The files ``config`` (``group/name``) composes, each with the package it lands at, as Hydra reads the
    defaults lists: ``group@package: option`` relative to the including file's group and package, a plain name a
    file of the same group at the same package, ``${model_engine}`` the engine, ``# @package _global_`` the root."""
    path = CONFIG_DIR / f"{config}.yaml"
    package = "" if package_header(path) == "_global_" else package
    tree = yaml.safe_load(path.read_text()) or {}
    files = []
    for entry in tree.get("defaults", ["_self_"]):
        if entry == "_self_":
            files.append((path, package))
        elif isinstance(entry, str):
            files += mounted_files(posixpath.join(group, entry) if group else entry, group, package, engine)
        else:
            ((key, option),) = entry.items()
            if option is None:
                continue  # an empty slot (the embedded layer's)
            key = key.removeprefix("override ")
            child_group, _, child_package = key.partition("@")
            child_group = posixpath.normpath(posixpath.join(group, child_group))
            child_package = join_package(package, child_package or child_group.split("/")[-1])
            option = engine if child_group == "model_engine" else option.replace("${model_engine}", engine)
            files += mounted_files(f"{child_group}/{option}", child_group, child_package, engine)
    if "_self_" not in tree.get("defaults", ["_self_"]):
        files.append((path, package))
    return files


def literal_definitions(engine: str) -> dict[str, list[str]]:
    """{full key: the files that give it a literal value} of the default composition with ``engine``; also checks
    that the files found compose exactly the keys Hydra composes (so the walk above reads the layout right)."""
    defined: dict[str, list[str]] = {}
    keys = set()
    for path, package in mounted_files("ppo_trainer", "", "", engine):
        body = yaml.safe_load(path.read_text()) or {}
        body.pop("defaults", None)
        for key, value in flatten(body).items():
            full = f"{package}.{key}" if package else key
            keys.add(full)
            if not (isinstance(value, str) and "${" in value):
                defined.setdefault(full, []).append(str(path.relative_to(CONFIG_DIR)))
    assert keys == set(composed([NO_EMBEDDED, f"model_engine={engine}"]))
    return defined


def test_the_layout_walk_finds_the_files_by_hand():
    walked = mounted_files("ppo_trainer", "", "", "dp")
    files = {(str(path.relative_to(CONFIG_DIR)), package) for path, package in walked}
    # read off ppo_trainer.yaml's and actor/actor.yaml's defaults lists
    assert ("engine/fsdp.yaml", "actor_rollout_ref.actor.fsdp_config") in files
    assert ("engine/fsdp.yaml", "critic.model.fsdp_config") in files
    assert ("actor/dp_actor.yaml", "actor_rollout_ref.actor") in files
    assert ("model_engine/dp.yaml", "") in files
    assert ("legacy_reward_impl.yaml", "") in files


@pytest.mark.parametrize("engine", ["dp", "megatron"])
def test_no_default_is_given_in_two_component_files(engine):
    twice = {key: files for key, files in literal_definitions(engine).items() if len(files) > 1}
    assert twice == {}, "the same key has a literal default in several files; keep it in one (interpolate elsewhere)"


def test_every_component_file_is_part_of_a_composition():
    reached = {path for engine in ("dp", "megatron") for path, _ in mounted_files("ppo_trainer", "", "", engine)}
    components = {
        path
        for path in CONFIG_DIR.rglob("*.yaml")
        if path.parent.name != "embedded" and path.name not in DERIVED_TRAINERS
    }
    assert len(components) > 15  # actor, ref, critic (3 each), engines, model_engine, ...: the walk saw the folders
    assert sorted(str(path.relative_to(CONFIG_DIR)) for path in components - reached) == []


# ---------------------------------------------------------------- loading


def test_load_section_holds_the_shared_engine_sections():
    fsdp = yaml.safe_load((CONFIG_DIR / "engine" / "fsdp.yaml").read_text())
    megatron = yaml.safe_load((CONFIG_DIR / "engine" / "megatron.yaml").read_text())
    actor, critic = load_section(ActorConfig), load_section(CriticConfig, {"strategy": "megatron"})
    assert actor.strategy == "fsdp"  # dp_actor.yaml
    assert actor.fsdp_config.reshard_after_forward is fsdp["reshard_after_forward"]
    assert critic.model.fsdp_config.reshard_after_forward is fsdp["reshard_after_forward"]
    assert critic.megatron.seed == megatron["seed"] and critic.strategy == "megatron"
