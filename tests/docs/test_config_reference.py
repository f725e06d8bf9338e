"""docs/config/ppo_trainer.md lists exactly the keys of ppo_trainer.yaml, each with the YAML file's default.

ppo_trainer.yaml, composed from its component files without the embedded layer (verl's defaults), is flattened to
dotted keys (lists are leaves, the ``hydra`` section and Hydra's ``defaults`` list are skipped, interpolations stay
unresolved);
the page's table rows are read as ``| `dotted.key` | type | `default` | meaning |``. Defaults are
compared as YAML values, so ``2.0e-3`` and ``0.002`` agree, ``null`` matches ``None``, and an interpolation matches
its ``${...}`` text.
"""

import re
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from verl.workers.config import compose_omegaconf

ROOT = Path(__file__).resolve().parents[2]
YAML_PATH = ROOT / "verl/trainer/config/ppo_trainer.yaml"
DOC_PATH = ROOT / "docs/config/ppo_trainer.md"
# A table cell separator: a pipe not escaped with a backslash.
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_KEY_CELL = re.compile(r"^`([A-Za-z0-9_.]+)`$")


def flatten(tree, prefix=""):
    """{dotted key: leaf value} of a nested dict; lists and scalars are leaves."""
    flat = {}
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(flatten(value, dotted))
        else:
            flat[dotted] = value
    return flat


def yaml_defaults() -> dict:
    tree = OmegaConf.to_container(compose_omegaconf(["~embedded@_global_"]), resolve=False)
    tree.pop("hydra", None)
    tree.pop("defaults", None)  # Hydra's defaults list: which files compose, not a config key
    return flatten(tree)


def doc_rows(text: str) -> dict[str, tuple[str, str]]:
    """{dotted key: (default cell, meaning cell)} of every table row whose first cell is a backticked key."""
    rows = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in _CELL_SPLIT.split(line.strip("|"))]
        match = _KEY_CELL.match(cells[0]) if cells else None
        if match is None or len(cells) < 4:
            continue
        key = match.group(1)
        assert key not in rows, f"{key} is listed twice in {DOC_PATH.name}"
        rows[key] = (cells[2], cells[3])
    return rows


def parse_doc_default(cell: str):
    assert cell.startswith("`") and cell.endswith("`"), f"default {cell!r} must be in backticks"
    text = cell[1:-1]
    if text in ("null", "None", "~"):
        return None
    return yaml.safe_load(text)


def same_value(doc_value, yaml_value) -> bool:
    if isinstance(yaml_value, bool) or isinstance(doc_value, bool):
        return doc_value is yaml_value
    if isinstance(yaml_value, int | float) and isinstance(doc_value, int | float):
        # 4294967296.0 may be written 4294967296.0 or 4.294967296e+9; an int default must stay an int, though
        return float(doc_value) == float(yaml_value) and type(doc_value) is type(yaml_value)
    if isinstance(yaml_value, list) and isinstance(doc_value, list):
        return len(doc_value) == len(yaml_value) and all(map(same_value, doc_value, yaml_value))
    return doc_value == yaml_value


def test_flatten_skips_nothing_but_hydra_and_the_defaults_list():
    flat = yaml_defaults()
    # Spot checks by hand against the YAML file: a nested float, an interpolation, a list, a null.
    assert flat["actor_rollout_ref.actor.optim.initial_loss_scale"] == 4294967296.0
    assert flat["actor_rollout_ref.rollout.response_length"] == "${data.max_response_length}"
    assert flat["trainer.logger"] == ["console", "wandb"]
    assert flat["data.train_files"] is None
    assert flat["critic.ppo_mini_batch_size"] == "${actor_rollout_ref.actor.ppo_mini_batch_size}"
    assert not any(key.startswith(("hydra", "defaults")) for key in flat)


def test_same_value_compares_yaml_forms():
    assert same_value(parse_doc_default("`2.0e-3`"), 0.002)
    assert same_value(parse_doc_default("`None`"), None)
    assert same_value(parse_doc_default("`[0.9, 0.999]`"), [0.9, 0.999])
    assert not same_value(parse_doc_default("`1`"), 1.0)  # an int default is not a float default
    assert not same_value(parse_doc_default("`false`"), 0)
    assert not same_value(parse_doc_default("`[]`"), None)


def test_every_yaml_key_is_documented_and_nothing_else():
    defaults = yaml_defaults()
    rows = doc_rows(DOC_PATH.read_text(encoding="utf-8"))
    missing = sorted(set(defaults) - set(rows))
    extra = sorted(set(rows) - set(defaults))
    assert not missing, f"keys of ppo_trainer.yaml missing from {DOC_PATH.name}: {missing}"
    assert not extra, f"keys in {DOC_PATH.name} that ppo_trainer.yaml does not have: {extra}"


def test_every_documented_default_matches_the_yaml_file():
    defaults = yaml_defaults()
    rows = doc_rows(DOC_PATH.read_text(encoding="utf-8"))
    wrong = []
    for key, (default_cell, meaning) in rows.items():
        assert meaning, f"{key} has no meaning in {DOC_PATH.name}"
        if key in defaults and not same_value(parse_doc_default(default_cell), defaults[key]):
            wrong.append(f"{key}: page says {default_cell}, YAML has {defaults[key]!r}")
    assert not wrong, "\n".join(wrong)
