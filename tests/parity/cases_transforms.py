"""Reference cases for TransformedDataset (tests/test_transforms.cpp): torchvision's
RandomCrop(size, padding) + RandomHorizontalFlip + ToTensor + Normalize written in torch ops, for
given crop offsets and flip (the C++ side applies the same draw)."""
import torch
import torch.nn.functional as F

from parity_lib import case, rng

MEAN = [0.4914, 0.4822, 0.4465]
STD = [0.2470, 0.2435, 0.2616]


def crop_flip_normalize(x, size, padding, top, left, flip):
    padded = F.pad(x.to(torch.uint8), (padding,) * 4)  # zeros, before ToTensor as in torchvision
    crop = padded[:, top:top + size, left:left + size]
    if flip:
        crop = crop.flip(-1)
    return (crop.float() / 255 - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)


def cases():
    for top, left, flip in ((0, 0, False), (8, 8, True), (3, 6, True), (4, 4, False), (8, 1, False)):
        n = f"transform_crop32_pad4_{top}_{left}_{int(flip)}"
        image = rng(n).integers(0, 256, (3, 32, 32)).astype("float64")
        params = {"size": 32, "padding": 4, "top": top, "left": left, "flip": flip, "mean": MEAN, "std": STD}
        yield case(n, lambda x, top=top, left=left, flip=flip: crop_flip_normalize(x, 32, 4, top, left, flip),
                   {"x": image}, dtype="f32", params=params, grad=False)
