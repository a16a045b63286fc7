"""A model from its config and seed: the one way a proxy or a pretrained model is built."""

from __future__ import annotations

import torch

from ilr_search.config import ModelConfig
from ilr_search.training.model import GLOBAL_RNG, ILRTransformer


def build_model(model_cfg: ModelConfig, seed: int) -> ILRTransformer:
    """The same seed gives the same initial weights, whatever schedule is trained later; with model_cfg.init
    set, the checkpoint's weights (pretrained.py; the recurrence knobs' parameters keep their initial values). The
    seeding and the initialisation hold model.GLOBAL_RNG: other threads' builds cannot draw in between."""
    with GLOBAL_RNG:
        torch.manual_seed(seed)
        model = ILRTransformer(model_cfg)
    if model_cfg.init:
        from ilr_search.training.pretrained import load_initial_weights

        load_initial_weights(model)
    return model
