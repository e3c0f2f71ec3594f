"""ProfCallback in a real PyTorch Lightning Trainer (skipped where lightning is not installed)."""

from __future__ import annotations

import pytest

import proflab


def test_lightning_trainer_writes_artifacts(tmp_path):
    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning")

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(16, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    cb = proflab.ProfCallback(tmp_path / "prof", framework="lightning", wait=1, warmup=1, active=3)
    assert isinstance(cb, L.Callback) and isinstance(cb, proflab.ProfCallback)
    trainer = L.Trainer(max_epochs=1, callbacks=[cb], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")  # fmt: skip
    trainer.fit(Tiny(), loader)
    table = (tmp_path / "prof" / "key_averages.txt").read_text()
    assert "aten::" in table and "Self CPU time total" in table
    assert proflab.load(tmp_path / "prof" / "trace.pt.trace.json.gz").steps.height == 3


def test_lightning_training_that_raises_still_stops_the_profiler(tmp_path):
    """A failure inside the recorded window: the profiler is stopped (not left running into
    the next one) and the steps recorded so far are written."""
    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning")

    class Failing(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(16, 1)

        def training_step(self, batch, batch_idx):
            if batch_idx == 4:  # inside the active window (wait 1, warm-up 1, active 4)
                raise RuntimeError("planted failure")
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    cb = proflab.ProfCallback(tmp_path / "prof", framework="lightning", wait=1, warmup=1, active=4)
    trainer = L.Trainer(max_epochs=1, callbacks=[cb], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")  # fmt: skip
    with pytest.raises(RuntimeError, match="planted failure"):
        trainer.fit(Failing(), torch.utils.data.DataLoader(data, batch_size=8))
    assert cb.core.prof is None
    assert not torch.autograd.profiler._is_profiler_enabled
    assert proflab.load(tmp_path / "prof" / "trace.pt.trace.json.gz").cpu.height > 0


def test_a_compiled_module_stays_compiled_under_the_callback(tmp_path):
    """ProfCallback observes without touching: a compiled network records its compiled
    regions (Inductor's generated code), not the eager autograd nodes it replaces."""
    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning")

    class Compiled(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.compile(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 1)))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    cb = proflab.ProfCallback(tmp_path / "prof", framework="lightning", wait=2, warmup=1, active=3)
    trainer = L.Trainer(max_epochs=1, callbacks=[cb], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")  # fmt: skip
    trainer.fit(Compiled(), torch.utils.data.DataLoader(data, batch_size=8))
    names = set(proflab.load(tmp_path / "prof" / "trace.pt.trace.json.gz").cpu["name"].to_list())
    assert "CompiledFunction" in names and "CompiledFunctionBackward" in names
    assert not names & {"AddmmBackward0", "GeluBackward0"}
