"""BERT-base pre-trained with masked-language modelling by Hugging Face's ``Trainer``, from its
config (random weights), on random tokens (sequence 128, batch 32): the program as a user writes
it, ``TrainingArguments`` as they come.

Fixes (``--fix``), each one argument changed, as a user makes it:

``base``          fp32, as ``TrainingArguments`` come (TF32 off)
``tf32``          ``tf32=True``
``bf16``          ``bf16=True``
``bf16-compile``  ``bf16=True, torch_compile=True``

On a machine without CUDA the model shrinks (2 layers, 128 wide, sequence 32, batch 2).
"""

import argparse
import tempfile

import torch
from transformers import BertConfig, BertForMaskedLM, Trainer, TrainingArguments

FIXES = {
    "base": {},
    "tf32": {"tf32": True},
    "bf16": {"bf16": True},
    "bf16-compile": {"bf16": True, "torch_compile": True},
}


class MaskedTokens(torch.utils.data.Dataset):
    """Random token blocks, 15% of positions masked, the labels the original tokens there."""

    def __init__(self, n: int, seq: int, vocab: int, mask_id: int):
        self.n, self.seq, self.vocab, self.mask_id = n, seq, vocab, mask_id

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(1000, self.vocab, (self.seq,), generator=g)
        masked = torch.rand(self.seq, generator=g) < 0.15
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
        return {"input_ids": torch.where(masked, torch.full_like(ids, self.mask_id), ids), "labels": labels,
                "attention_mask": torch.ones_like(ids)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fix", choices=tuple(FIXES), default="base")
    ap.add_argument("--steps", type=int, default=60)
    a = ap.parse_args()
    gpu = torch.cuda.is_available()
    cfg = BertConfig() if gpu else BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                                                intermediate_size=256)
    seq, batch = (128, 32) if gpu else (32, 2)
    torch.manual_seed(0)
    model = BertForMaskedLM(cfg)
    data = MaskedTokens(batch * a.steps, seq, cfg.vocab_size, mask_id=103)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch, max_steps=a.steps,
                                 save_strategy="no", report_to="none", **FIXES[a.fix])
        Trainer(model=model, args=args, train_dataset=data).train()


if __name__ == "__main__":
    main()
