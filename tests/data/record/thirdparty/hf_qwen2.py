"""A Qwen2-shaped causal LM (Qwen2.5-0.5B's shape: 24 layers, 896 wide, grouped-query attention
with 2 KV heads, SwiGLU 4,864 wide, RoPE, tied embeddings; 151,936-token vocabulary) trained with Hugging Face's ``Trainer`` from its config (random
weights) on random tokens: the program as a user writes it, ``TrainingArguments`` as they come.

Fixes (``--fix``), each one argument changed, as a user makes it:

``base``          fp32, as ``TrainingArguments`` come (TF32 off)
``tf32``          ``tf32=True``
``bf16``          ``bf16=True`` (autocast bf16)
``bf16-compile``  ``bf16=True, torch_compile=True``

On a machine without CUDA the model shrinks (2 layers, 128 wide, sequence 64, batch 2).
"""

import argparse
import tempfile

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Trainer, TrainingArguments

FIXES = {
    "base": {},
    "tf32": {"tf32": True},
    "bf16": {"bf16": True},
    "bf16-compile": {"bf16": True, "torch_compile": True},
}


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seq: int, vocab: int):
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, self.vocab, (self.seq,), generator=g)
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fix", choices=tuple(FIXES), default="base")
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    gpu = torch.cuda.is_available()
    size = (dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14)
            if gpu else dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4))
    cfg = Qwen2Config(vocab_size=151936 if gpu else 4096, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=True, **size)
    seq, batch = (512, 8) if gpu else (64, 2)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch, max_steps=a.steps,
                                 save_strategy="no", report_to="none", **FIXES[a.fix])
        Trainer(model=model, args=args, train_dataset=RandomTokens(batch * a.steps, seq, cfg.vocab_size)).train()


if __name__ == "__main__":
    main()
