"""GR00T N1.6's training image transforms, as the baseline and tuned modes run them.

GR00T trains with a crop of 0.95 of each side at a random offset, a resize to the model's image
size and torchvision's ``ColorJitter(brightness=0.3, contrast=0.4, saturation=0.5, hue=0.08)``.
Every trainer mode applies the same definition (docs/trainer.md, "Augmentations"):

- baseline / tuned: ``RandomCrop`` -> ``Resize`` -> ``ToTensor`` -> :class:`GrootColorJitter`
  -> ``Normalize`` in the DataLoader workers (torchvision);
- loongforge: the DataFusion loader's fused crop/resize/jitter/normalize pass (the GPU kernel or
  its CPU twin; Note [Colour jitter] in src/data/image_ops.h).

:class:`GrootColorJitter` differs from ``torchvision.transforms.ColorJitter`` in one documented
way: the four ops run in the fixed order brightness -> contrast -> saturation -> hue instead of a
random order per call, so that all modes share one definition (the fused kernels compute the
contrast mean once per image, which a random order would not allow without a second pass). The
factors are drawn as torchvision draws them: uniform in [1 - x, 1 + x], hue in [-0.08, 0.08].
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

AUGMENT_CHOICES = ("groot", "none")
BRIGHTNESS, CONTRAST, SATURATION, HUE = 0.3, 0.4, 0.5, 0.08  # GR00T N1.6


class GrootColorJitter(torch.nn.Module):
    """Colour jitter of a float image tensor [..., 3, H, W] in [0, 1], torchvision's functional
    ops in the fixed order brightness -> contrast -> saturation -> hue. Factors come from the
    global torch RNG (the baseline dataset seeds it per sample)."""

    def __init__(self, brightness: float = BRIGHTNESS, contrast: float = CONTRAST,
                 saturation: float = SATURATION, hue: float = HUE) -> None:
        super().__init__()
        if min(brightness, contrast, saturation) < 0 or not 0 <= hue <= 0.5:
            raise ValueError(f"colour jitter ranges must be >= 0 (hue <= 0.5): brightness "
                             f"{brightness}, contrast {contrast}, saturation {saturation}, "
                             f"hue {hue}")
        self.ranges = (brightness, contrast, saturation, hue)

    def draw(self) -> Tuple[float, float, float, float]:
        """(brightness, contrast, saturation, hue) factors, drawn in that order."""
        b, c, s, h = self.ranges
        u = [float(torch.empty(1).uniform_(lo, hi))
             for lo, hi in ((1 - b, 1 + b), (1 - c, 1 + c), (1 - s, 1 + s), (-h, h))]
        return u[0], u[1], u[2], u[3]

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return apply_jitter(img, *self.draw())


def apply_jitter(img: torch.Tensor, brightness: float, contrast: float, saturation: float,
                 hue: float) -> torch.Tensor:
    """torchvision's adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue, in this
    order (Note [Colour jitter]); the definition the loader's kernels are tested against."""
    import torchvision.transforms.functional as F

    img = F.adjust_brightness(img, brightness)
    img = F.adjust_contrast(img, contrast)
    img = F.adjust_saturation(img, saturation)
    return F.adjust_hue(img, hue) if hue != 0 else img


def loader_flags(augment: str, no_augment: bool = False) -> Tuple[bool, bool]:
    """(train, color_jitter) for the loaders from the trainer's --augment (and the older
    --no-augment): 'groot' = random crop + jitter, 'none' = centre crop, no jitter."""
    if augment not in AUGMENT_CHOICES:
        raise ValueError(f"--augment {augment!r}: expected one of {AUGMENT_CHOICES}")
    on = augment == "groot" and not no_augment
    return on, on


def describe(augment: str, no_augment: bool = False, crop_fraction: float = 0.95,
             image_size: Optional[int] = None) -> str:
    """One line for the trainer's module status."""
    train, jitter = loader_flags(augment, no_augment)
    size = f" -> resize {image_size}" if image_size else " -> resize"
    if not train:
        return f"none (centre crop {crop_fraction:g}{size})"
    return (f"groot (random crop {crop_fraction:g}{size}, colour jitter b{BRIGHTNESS} "
            f"c{CONTRAST} s{SATURATION} h{HUE}, fixed order)")
