"""ProfCallback in a real PyTorch Lightning Trainer (skipped where lightning is not installed)."""

from __future__ import annotations

import pytest

import proflab


def _module(L, torch, net, fail_at: int | None = None):
    """A regression LightningModule around ``net`` (its step raises at batch ``fail_at``)."""

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            if batch_idx == fail_at:
                raise RuntimeError("planted failure")
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Module()


def _fit(L, torch, module, cb) -> None:
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    trainer = L.Trainer(max_epochs=1, callbacks=[cb], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")  # fmt: skip
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))


def test_lightning_trainer_writes_artifacts(tmp_path):
    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning")
    cb = proflab.ProfCallback(tmp_path / "prof", framework="lightning", wait=1, warmup=1, active=3)
    assert isinstance(cb, L.Callback) and isinstance(cb, proflab.ProfCallback)
    _fit(L, torch, _module(L, torch, torch.nn.Linear(16, 1)), cb)
    table = (tmp_path / "prof" / "key_averages.txt").read_text()
    assert "aten::" in table and "Self CPU time total" in table
    assert proflab.load(tmp_path / "prof" / "trace.pt.trace.json.gz").steps.height == 3


def test_lightning_training_that_raises_still_stops_the_profiler(tmp_path):
    """A failure inside the recorded window: the profiler is stopped (not left running into
    the next one) and the steps recorded so far are written."""
    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning")
    cb = proflab.ProfCallback(tmp_path / "prof", framework="lightning", wait=1, warmup=1, active=4)
    with pytest.raises(RuntimeError, match="planted failure"):  # inside the active window (wait 1, warm-up 1, active 4)
        _fit(L, torch, _module(L, torch, torch.nn.Linear(16, 1), fail_at=4), cb)
    assert cb.core.prof is None
    assert not torch.autograd.profiler._is_profiler_enabled
    assert proflab.load(tmp_path / "prof" / "trace.pt.trace.json.gz").cpu.height > 0


def test_a_compiled_module_stays_compiled_under_the_callback(tmp_path):
    """ProfCallback observes without touching: a compiled network records its compiled
    regions (Inductor's generated code), not the eager autograd nodes it replaces."""
    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning")
    net = torch.compile(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 1)))
    cb = proflab.ProfCallback(tmp_path / "prof", framework="lightning", wait=2, warmup=1, active=3)
    _fit(L, torch, _module(L, torch, net), cb)
    names = set(proflab.load(tmp_path / "prof" / "trace.pt.trace.json.gz").cpu["name"].to_list())
    assert "CompiledFunction" in names and "CompiledFunctionBackward" in names
    assert not names & {"AddmmBackward0", "GeluBackward0"}
