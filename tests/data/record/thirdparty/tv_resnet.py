"""torchvision's ResNet-50 trained from scratch on JPEG images through a ``DataLoader``: the
loop of torchvision's classification reference (``RandomResizedCrop``, flip, ``ToTensor``,
``Normalize``; SGD with momentum), images decoded from JPEG bytes held in memory (as an
``ImageFolder`` reads files: PIL decode per sample).

Fixes (``--fix``):

``base``       ``num_workers=0``, fp32 (the loader's default)
``workers``    ``num_workers=8, pin_memory=True, persistent_workers=True`` (copies ``non_blocking``)
``amp``        the ``workers`` loader, plus bf16 autocast and ``channels_last``

On a machine without CUDA: ResNet-18 at 64 px, batch 4.
"""

import argparse

import torch
import torchvision
import torchvision.transforms as T

from _jpegs import JPEGs

FIXES = ("base", "workers", "amp")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fix", choices=FIXES, default="base")
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    gpu = torch.cuda.is_available()
    dev = "cuda" if gpu else "cpu"
    px, batch = (224, 64) if gpu else (64, 4)
    tf = T.Compose([T.RandomResizedCrop(px), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = JPEGs(64 if gpu else 8, tf)
    loader_kw = {} if a.fix == "base" else dict(num_workers=8, pin_memory=True, persistent_workers=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, drop_last=True, **loader_kw)
    torch.manual_seed(0)
    model = (torchvision.models.resnet50() if gpu else torchvision.models.resnet18()).to(dev)
    fmt = torch.channels_last if a.fix == "amp" else torch.contiguous_format
    model = model.to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    crit = torch.nn.CrossEntropyLoss()
    model.train()
    for step, (x, y) in enumerate(loader):
        if step == a.steps:
            break
        x = x.to(dev, non_blocking=True).to(memory_format=fmt)
        y = y.to(dev, non_blocking=True)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=a.fix == "amp"):
            loss = crit(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
