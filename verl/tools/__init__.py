"""verl's tool API: tools a multi-turn rollout lets the model call, in verl's names and contracts.

- :mod:`verl.tools.schemas`: the OpenAI-format models (tool schemas, parsed calls, :class:`ToolResponse`).
- :mod:`verl.tools.base_tool`: :class:`BaseTool`, the stateful tool (``create`` / ``execute`` / ``calc_reward`` /
  ``release`` per trajectory instance), declared in a tool config YAML.
- :mod:`verl.tools.function_tool`: ``@function_tool``, a plain function as a stateless tool, schema inferred.
- :mod:`verl.tools.tool_registry`: loading both from ``multi_turn.tool_config_path`` / ``function_tool_path``.
- :mod:`verl.tools.calculator_tool`: the integer calculator of the embedded tool task
  (``verl/tools/configs/calculator_tool.yaml``).

As in verl, the package itself re-exports nothing: import from the submodules. Nothing here imports Ray, and
tool responses are text only (a multimodal :class:`ToolResponse` is for the caller to refuse).
"""
