"""A small CNN classifying generated images (no download, no torchvision).

Each class has a seeded prototype, smooth random blobs (low-resolution noise upsampled);
an example is its class's prototype shifted by a few pixels, scaled in contrast and
covered in Gaussian noise. The labels make the data partitionable by label
(--partition dirichlet:ALPHA, shards:K).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from ..errors import ExoframeError
from ..host_memory import check_fits
from .base import Workload, shard_factory


class CNN(nn.Module):
    def __init__(self, channels: int, size: int, classes: int, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(2 * width * (size // 4) ** 2, classes)

    def logits(self, images):
        return self.head(self.features(images).flatten(1))

    def forward(self, batch):
        images, labels = batch
        return F.cross_entropy(self.logits(images), labels)


def accuracy(model: CNN, batch) -> dict:
    images, labels = batch
    return {"accuracy": (model.logits(images).argmax(1) == labels).float().mean().item()}


def generated_images(n: int, classes: int, channels: int, size: int, noise: float, shift: int,
                     seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(classes, channels, 4, 4, generator=g)
    prototypes = F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    labels = torch.randint(classes, (n,), generator=g)
    images = prototypes[labels] * (0.5 + torch.rand(n, 1, 1, 1, generator=g))
    shifts = torch.randint(-shift, shift + 1, (n, 2), generator=g)
    for dy in range(-shift, shift + 1):  # shift each example by its (dy, dx), wrapping around
        for dx in range(-shift, shift + 1):
            chosen = (shifts[:, 0] == dy) & (shifts[:, 1] == dx)
            images[chosen] = torch.roll(images[chosen], (dy, dx), dims=(2, 3))
    images += noise * torch.randn(images.shape, generator=g)
    return TensorDataset(images, labels)


def image(classes: int = 10, channels: int = 1, size: int = 16, noise: float = 1.5,
          shift: int = 2, width: int = 16, train_examples: int = 10_000,
          val_examples: int = 2_000, data_seed: int = 0) -> Workload:
    """Small CNN on generated images of `classes` classes; reports val_accuracy."""
    if size % 4 or size < 4:
        raise ExoframeError(f"size: images are pooled twice by 2, so size must be a multiple "
                            f"of 4, got {size}.")
    if classes < 2:
        raise ExoframeError(f"classes: at least 2, got {classes}.")
    examples = train_examples + val_examples
    # float32 images, made three times over (scaled prototypes, shifted, noise), and labels
    check_fits(f"train_examples, val_examples, channels, size: {examples:,} images take",
               examples * (12 * channels * size * size + 32), "give fewer or smaller ones")
    data = generated_images(examples, classes, channels, size, noise, shift, data_seed)
    images, labels = data.tensors
    train = TensorDataset(images[:train_examples], labels[:train_examples])
    val = TensorDataset(images[train_examples:], labels[train_examples:])
    return Workload(build_model=lambda: CNN(channels, size, classes, width),
                    dataset=shard_factory(train, val), batch_size=32, lr=3e-3, name="image",
                    metrics=accuracy)
