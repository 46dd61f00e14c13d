"""Test images and a tiny image classifier built at test time (the image generators live in pipeline.images.samples)."""

from __future__ import annotations

from pipeline.images.samples import *  # noqa: F401,F403 - the tests use them as samples.<name>
from pipeline.images.samples import DOC_LINES, text_page  # noqa: F401


def build_tiny_classifier(folder, *, num_classes: int = 4, seed: int = 0, image_size: int = 32):
    """A tiny EfficientNet-Lite (width 0.25, depth 0.25, 32 px) with random weights, saved as a state dict."""
    import json

    import torch

    from pipeline.tasks.classify_image import build_model

    folder.mkdir(parents=True, exist_ok=True)
    config = {"architecture": "efficientnet-lite0", "num_classes": num_classes, "image_size": image_size,
              "overrides": {"width_coefficient": 0.25, "depth_coefficient": 0.25},
              "labels": ["cat", "dog", "cup", "car", "bird", "boat"][:num_classes], "name": "tiny-lite"}
    torch.manual_seed(seed)
    model = build_model(config)
    # non-trivial batch-norm statistics, so that a batch/one-row mix-up would show
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    (folder / "config.json").write_text(json.dumps(config))
    torch.save(model.state_dict(), folder / "model.pth")
    return folder
