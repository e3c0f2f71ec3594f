"""A timm Vision Transformer (``vit_small_patch16_224``) trained from scratch on JPEG images
through a ``DataLoader`` (``RandomResizedCrop``, flip, ``ToTensor``, ``Normalize``; AdamW), the
images decoded from JPEG bytes held in memory (as an ``ImageFolder`` reads files).

Fixes (``--fix``):

``base``      ``num_workers=0``, fp32 (TF32 off: PyTorch's default for matmuls)
``workers``   ``num_workers=8, pin_memory=True, persistent_workers=True``
``high``      the ``workers`` loader, plus ``torch.set_float32_matmul_precision("high")`` (TF32)
``amp``       the ``high`` program, plus bf16 autocast

On a machine without CUDA: a 2-layer 64-wide ViT at 64 px, batch 4.
"""

import argparse

import timm
import torch
import torchvision.transforms as T

from _jpegs import JPEGs

FIXES = ("base", "workers", "high", "amp")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fix", choices=FIXES, default="base")
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    gpu = torch.cuda.is_available()
    dev = "cuda" if gpu else "cpu"
    if a.fix in ("high", "amp"):
        torch.set_float32_matmul_precision("high")
    px, batch = (224, 64) if gpu else (64, 4)
    tf = T.Compose([T.RandomResizedCrop(px), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    loader_kw = {} if a.fix == "base" else dict(num_workers=8, pin_memory=True, persistent_workers=True)
    loader = torch.utils.data.DataLoader(JPEGs(64 if gpu else 8, tf), batch_size=batch, shuffle=True, drop_last=True,
                                         **loader_kw)
    torch.manual_seed(0)
    kw = {} if gpu else dict(img_size=64, embed_dim=64, depth=2, num_heads=2)
    model = timm.create_model("vit_small_patch16_224", num_classes=1000, **kw).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    crit = torch.nn.CrossEntropyLoss()
    model.train()
    for step, (x, y) in enumerate(loader):
        if step == a.steps:
            break
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=a.fix == "amp"):
            loss = crit(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
