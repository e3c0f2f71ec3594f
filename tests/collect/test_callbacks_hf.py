"""ProfCallback in a real Hugging Face Trainer (skipped where transformers is not installed).

The model is built from a config (no download): a one-layer BERT classifier on random tokens.
On a machine with CUDA the Trainer runs on the GPU and the trace holds its kernels.
"""

from __future__ import annotations

import pytest

import proflab


def test_hf_trainer_writes_artifacts(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, n=64):
            g = torch.Generator().manual_seed(0)
            self.ids = torch.randint(0, 100, (n, 16), generator=g)
            self.labels = torch.randint(0, 2, (n,), generator=g)

        def __len__(self):
            return len(self.labels)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.labels[i]}

    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32, num_labels=2)  # fmt: skip
    model = transformers.BertForSequenceClassification(config)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, max_steps=8,
                                          report_to=[], save_strategy="no", logging_strategy="no",
                                          disable_tqdm=True, dataloader_num_workers=0)  # fmt: skip
    cb = proflab.ProfCallback(tmp_path / "prof", framework="hf", wait=1, warmup=1, active=3)
    assert isinstance(cb, transformers.TrainerCallback) and isinstance(cb, proflab.ProfCallback)
    transformers.Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[cb]).train()

    table = (tmp_path / "prof" / "key_averages.txt").read_text()
    assert "aten::" in table and "Self CPU time total" in table
    trace = proflab.load(tmp_path / "prof" / "trace.pt.trace.json.gz")
    assert trace.steps.height == 3
    if torch.cuda.is_available():
        assert "Self CUDA time total" in table and trace.gpu.height > 0
