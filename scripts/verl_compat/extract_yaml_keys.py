"""Record which keys verl's own YAML defines, per trainer config, as data: ``verl/workers/config/verl_keys.json``.

Hydra's ``+key=value`` adds a key and refuses one the config already has. verl's scripts therefore write ``+`` before
exactly the keys verl's YAML leaves out; where this package's YAML holds such a key with its default, the composition
turns that ``+`` into ``++`` (:func:`verl.workers.config.verl_keys.defined_in_verl`), and a ``+`` on a key verl's
YAML does define keeps Hydra's refusal, as in verl. Deciding that needs verl's key layout, which this script reads
once: it writes each config folder of verl's commit (read from a bare git directory) to a temporary directory,
composes each of verl's PPO trainer configs there with Hydra (no override but ``hydra.searchpath``, pointed at that
copy of ``verl/trainer/config``, so that nothing of verl is imported), and stores every key path of each.

Layout of the file: ``trees`` holds the key trees of ``ppo_trainer`` and ``ppo_megatron_trainer`` (nested mappings;
a leaf is null); ``configs`` maps every other config to the one of those it is built on (``like``), the dotted keys
it has beyond that one's (``added``) and those of that one's it lacks (``removed``).

``python scripts/verl_compat/extract_yaml_keys.py [--git-dir DIR] [--commit C] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from verl.workers.config.verl_keys import dotted

logger = logging.getLogger("verl.compat")

DEFAULT_GIT_DIR = "/work/.mirror/verl-project+verl/repo"
DEFAULT_COMMIT = "1dda039"
OUT_FILE = Path(__file__).resolve().parents[2] / "verl" / "workers" / "config" / "verl_keys.json"
# verl's config folders, and the trainer configs of each whose keys are recorded (this package's names are verl's)
CONFIG_DIRS = {
    "verl/trainer/config": ("ppo_trainer", "ppo_megatron_trainer"),
    "verl/experimental/fully_async_policy/config": ("fully_async_ppo_trainer", "fully_async_ppo_megatron_trainer"),
    "verl/experimental/one_step_off_policy/config": ("one_step_off_ppo_trainer", "one_step_off_ppo_megatron_trainer"),
}
# the configs stored whole; the others are stored as their differences to one of these
TREES = ("ppo_trainer", "ppo_megatron_trainer")


def export_config_dirs(git_dir: str, commit: str, root: Path) -> None:
    """Write verl's config folders at ``commit`` under ``root`` (laid out as in verl's repository)."""
    archive = subprocess.run(
        ["git", f"--git-dir={git_dir}", "archive", commit, *CONFIG_DIRS], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)


def key_tree(config: Any) -> dict[str, Any]:
    """The key paths of a composed config as nested mappings (a leaf is None); list items are not keys."""
    from omegaconf import DictConfig

    return {
        key: key_tree(config._get_node(key)) if isinstance(config._get_node(key), DictConfig) else None
        for key in config.keys()
    }


def compose_trees(root: Path) -> dict[str, dict[str, Any]]:
    """Each recorded config of the folders under ``root``, composed as verl's Hydra composes it: its key tree."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    searchpath = f"hydra.searchpath=[file://{root / 'verl/trainer/config'}]"
    trees = {}
    for folder, names in CONFIG_DIRS.items():
        for name in names:
            GlobalHydra.instance().clear()
            with initialize_config_dir(config_dir=str(root / folder), version_base=None):
                trees[name] = key_tree(compose(config_name=name, overrides=[searchpath]))
    GlobalHydra.instance().clear()
    return trees


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", default=DEFAULT_GIT_DIR, help="bare git directory of verl's repository")
    parser.add_argument("--commit", default=DEFAULT_COMMIT, help="verl's commit whose YAML to read")
    parser.add_argument("--out", type=Path, default=OUT_FILE, help="the JSON file to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        export_config_dirs(args.git_dir, args.commit, Path(tmp))
        trees = compose_trees(Path(tmp))
    payload = {
        "verl_commit": args.commit,
        "trees": {name: trees[name] for name in TREES},
        "configs": {name: differences(dotted(tree), trees) for name, tree in trees.items() if name not in TREES},
    }
    args.out.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    logger.info("wrote %s: the keys of %d configs of verl %s", args.out, len(trees), args.commit)


def differences(keys: set[str], trees: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``keys`` as the stored tree closest to them and the keys added to and removed from it."""
    like = min(TREES, key=lambda name: len(keys ^ dotted(trees[name])))
    return {"like": like, "added": sorted(keys - dotted(trees[like])), "removed": sorted(dotted(trees[like]) - keys)}


if __name__ == "__main__":
    main()
