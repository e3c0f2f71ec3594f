"""The image programs' dataset: ``n`` random 500x375 JPEGs (ImageNet's typical size), encoded once
and held in memory, decoded per sample with PIL (as an ``ImageFolder`` reads files)."""

import io

import numpy as np
import torch
from PIL import Image


class JPEGs(torch.utils.data.Dataset):
    def __init__(self, n: int, transform, size=(500, 375)):
        rng = np.random.default_rng(0)
        self.blobs, self.transform = [], transform
        for _ in range(n):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
            self.blobs.append(buf.getvalue())

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        img = Image.open(io.BytesIO(self.blobs[i % len(self.blobs)])).convert("RGB")
        return self.transform(img), i % 1000
