"""Lightning's demo language model (``lightning.pytorch.demos.LightningTransformer``: an
``nn.Transformer`` encoder-decoder, SGD) at a size that keeps an H100 busy (1024 wide, 16 heads,
4 + 4 layers, blocks of 256 tokens, batch 16), trained by ``lightning.Trainer`` on random
WikiText2-sized tokens (the demo downloads WikiText2; this machine has no network).

Fixes (``--fix``), each what Lightning's own start-up message or docs suggest:

``base``   ``Trainer()`` as it comes (``precision="32-true"``; TF32 off)
``high``   ``torch.set_float32_matmul_precision("high")`` (Lightning's start-up hint: TF32)
``bf16``   ``Trainer(precision="bf16-mixed")``

On a machine without CUDA: 64 wide, 1 + 1 layers, blocks of 16, batch 2.
"""

import argparse

import lightning as L
import torch
from lightning.pytorch.demos import LightningTransformer, Transformer

FIXES = ("base", "high", "bf16")
VOCAB = 33278  # WikiText2's


class RandomBlocks(torch.utils.data.Dataset):
    def __init__(self, n: int, block: int):
        self.n, self.block = n, block

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randint(0, VOCAB, (self.block + 1,), generator=g)
        return x[:-1], x[1:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fix", choices=FIXES, default="base")
    ap.add_argument("--steps", type=int, default=60)
    a = ap.parse_args()
    gpu = torch.cuda.is_available()
    if a.fix == "high":
        torch.set_float32_matmul_precision("high")
    size = dict(ninp=1024, nhead=16, nhid=4096, nlayers=4) if gpu else dict(ninp=64, nhead=2, nhid=64, nlayers=1)
    block, batch = (256, 16) if gpu else (16, 2)
    L.seed_everything(0)
    lm = LightningTransformer(vocab_size=VOCAB)
    lm.model = Transformer(vocab_size=VOCAB, **size)
    lm.prepare_data = lambda: None  # the demo downloads WikiText2 here; this data is in memory
    loader = torch.utils.data.DataLoader(RandomBlocks(batch * a.steps, block), batch_size=batch)
    trainer = L.Trainer(max_steps=a.steps, precision="bf16-mixed" if a.fix == "bf16" else "32-true",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="auto", devices=1)
    trainer.fit(lm, loader)


if __name__ == "__main__":
    main()
