"""The pipeline layout check: which splits of a model's layers over stages megatron-core can build, refused by key.

(The stages themselves run on several ranks: tests/special_distributed/test_megatron_pp_gloo.py.)
"""

from types import SimpleNamespace

import pytest

from verl.models.mcore.pipeline import check_pipeline_fits

KEY = "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"


def model(layers):
    return SimpleNamespace(num_hidden_layers=layers)


@pytest.mark.parametrize(
    "layers, stages, split",
    [
        (2, 1, {}),  # one stage holds everything
        (4, 2, {}),  # 2 + 2
        (27, 2, {"num_layers_in_last_pipeline_stage": 13}),  # 14 + 13 (verl's moonlight script)
        (61, 16, {"num_layers_in_first_pipeline_stage": 4, "num_layers_in_last_pipeline_stage": 1}),  # 4 + 14x4 + 1
        # the embedding and the loss count as a layer each: 94 + 2 = 96 = 8 x 12 (verl's qwen3-235b script)
        (94, 8, {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}),
        (3, 2, {"pipeline_model_parallel_layout": "E|t*3|L"}),  # megatron-core's own layout: its check
    ],
)
def test_layouts_megatron_core_can_build_pass(layers, stages, split):
    check_pipeline_fits(model(layers), stages, KEY, split)


@pytest.mark.parametrize(
    "layers, stages, split, match",
    [
        (3, 2, {}, r"pipeline_model_parallel_size=2: the model's 3 layers do not share out evenly over 2"),
        # the tiny model under the moonlight script's 13-layer last stage: megatron-core's own error is an invalid
        # checkpoint offset of -11
        (2, 2, {"num_layers_in_last_pipeline_stage": 13}, r"num_layers_in_last_pipeline_stage=13: the model has 2"),
        # 10 - 3 - 3 = 4 layers left for 2 stages but both ends set with 2 stages: nothing may be left over
        (10, 2, {"num_layers_in_first_pipeline_stage": 3, "num_layers_in_last_pipeline_stage": 3}, r"after the first"),
        # 9 - 4 = 5 layers for 2 middle stages
        (9, 3, {"num_layers_in_first_pipeline_stage": 4}, r"after the first stage 4 layers"),
        # 6 + 1 (embedding) = 7 over 2 stages
        (6, 2, {"account_for_embedding_in_pipeline_split": True}, r"6 layers do not share out evenly"),
    ],
)
def test_layouts_that_do_not_fit_are_refused_by_key(layers, stages, split, match):
    with pytest.raises(ValueError, match=match):
        check_pipeline_fits(model(layers), stages, KEY, split)
