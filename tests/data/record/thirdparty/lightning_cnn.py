"""torchvision's ConvNeXt-Tiny as a ``LightningModule`` (AdamW), trained by ``lightning.Trainer``
on JPEG images through a ``DataLoader`` (``RandomResizedCrop``, flip, ``ToTensor``,
``Normalize``), the images decoded per sample (``_jpegs.JPEGs``).

Fixes (``--fix``), each what Lightning's own warnings or docs suggest:

``base``     ``DataLoader(num_workers=0)``, ``Trainer()`` as it comes (``precision="32-true"``)
``workers``  ``num_workers=8, pin_memory=True, persistent_workers=True`` (Lightning warns that
             the loader "does not have many workers")
``high``     the ``workers`` loader, plus ``torch.set_float32_matmul_precision("high")`` (Lightning's
             start-up hint: TF32 for ConvNeXt's ``nn.Linear`` layers; cuDNN's convolutions use
             TF32 already, PyTorch's default)
``bf16``     the ``workers`` loader, plus ``Trainer(precision="bf16-mixed")``

On a machine without CUDA: a small network at 64 px, batch 4.
"""

import argparse

import lightning as L
import torch
import torchvision
import torchvision.transforms as T

from _jpegs import JPEGs

FIXES = ("base", "workers", "high", "bf16")


class Classifier(L.LightningModule):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.model(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.05)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fix", choices=FIXES, default="base")
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    gpu = torch.cuda.is_available()
    if a.fix == "high":
        torch.set_float32_matmul_precision("high")
    px, batch = (224, 64) if gpu else (64, 4)
    tf = T.Compose([T.RandomResizedCrop(px), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    loader_kw = {} if a.fix == "base" else dict(num_workers=8, pin_memory=True, persistent_workers=True)
    loader = torch.utils.data.DataLoader(JPEGs(64 if gpu else 8, tf), batch_size=batch, shuffle=True, drop_last=True,
                                         **loader_kw)
    L.seed_everything(0)
    model = torchvision.models.convnext_tiny() if gpu else torchvision.models.resnet18()
    trainer = L.Trainer(max_steps=a.steps, precision="bf16-mixed" if a.fix == "bf16" else "32-true",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="auto", devices=1)
    trainer.fit(Classifier(model), loader)


if __name__ == "__main__":
    main()
