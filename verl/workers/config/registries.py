"""The registries whose names the typed config checks: rollout engines and reward managers.

Each registry lives here, below both the config section that checks a name (``actor_rollout_ref.rollout.name``,
``reward_model.reward_manager``) and the implementations that register under it (:mod:`verl.workers.rollout`,
:mod:`verl.workers.reward_manager`), so that neither side imports the other. A registry names the module of its
built-in entries as a string and imports it on first use (:class:`~verl.utils.registry.Registry`'s ``builtins``):
a name check therefore sees the built-ins and every name a user registered before it, without this package
importing the implementations. The implementation packages re-export their registry under the names verl users
know (``verl.workers.rollout.ROLLOUT_REGISTRY``, ``verl.workers.reward_manager.REWARD_MANAGER_REGISTRY``).
"""

from __future__ import annotations

from verl.utils.registry import Registry

__all__ = ["REWARD_MANAGER_REGISTRY", "ROLLOUT_REGISTRY", "TOOL_PARSER_MODULE", "tool_parser_names"]

# rollout name -> BaseRollout subclass (hf, naive and vllm are built in)
ROLLOUT_REGISTRY: Registry[type] = Registry(
    "rollout", config_key="actor_rollout_ref.rollout.name", builtins="verl.workers.rollout"
)

# reward manager name -> reward manager class (naive, dapo and gdpo are built in)
REWARD_MANAGER_REGISTRY: Registry[type] = Registry(
    "reward manager", config_key="reward_model.reward_manager", builtins="verl.workers.reward_manager"
)

# the module whose import registers the tool-call parsers of the agent loops (multi_turn.format), by name
TOOL_PARSER_MODULE = "verl.experimental.agent_loop.tool_parser"


def tool_parser_names() -> list[str]:
    """The names ``actor_rollout_ref.rollout.multi_turn.format`` accepts: the agent loops' registered tool parsers
    (verl's ``ToolParser`` registry), read by importing :data:`TOOL_PARSER_MODULE` by name on first use, as the
    registries above import their built-ins; a parser a user registered before the check counts too."""
    import importlib

    module = importlib.import_module(TOOL_PARSER_MODULE)
    return sorted(module.ToolParser._registry)
