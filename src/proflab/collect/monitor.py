"""GPUMonitor: NVML sampling of every GPU in a background thread, off the profiled work.

Each tick (``period_s``, default 0.1 s) reads, per device: board power, the total-energy
counter, GPU and memory utilisation, memory in use, SM and memory clocks, temperature and the
clock-event (throttle) reasons; on devices where ``nvmlGpmQueryDeviceSupport`` says so (Hopper
and later), the GPM metrics between this tick and the last: SM activity, SM occupancy,
tensor-pipe activity, DRAM bandwidth utilisation, PCIe and NVLink traffic.

A metric a device refuses with NOT_SUPPORTED on the first tick is not asked for again: its
column is null for that device (missing is not zero). Any other NVML failure while sampling is
kept in ``errors`` and sampling goes on; a failure while starting raises :class:`MonitorError`.
NVML errors become proflab errors in one place, :func:`_nvml_error`.

Columns of ``samples`` (one row per device per tick; units in the names):

``device`` NVML index, ``time_ns`` wall clock (Unix epoch ns), ``elapsed_s`` since start,
``power_w`` (``nvmlDeviceGetPowerUsage``: on A100/H100 a one-second average),
``power_instant_w`` (the instantaneous field, null where the driver lacks it), ``energy_j``
(``nvmlDeviceGetTotalEnergyConsumption`` differenced from the start), ``util_gpu_pct``,
``util_mem_pct``, ``mem_used_bytes``, ``mem_total_bytes``, ``sm_clock_mhz``,
``mem_clock_mhz``, ``temp_c``, ``throttle_mask`` (NVML's clock-event bitmask), ``throttle``
(its names), and the GPM columns ``gpm_sm_active_pct``, ``gpm_sm_occupancy_pct``,
``gpm_tensor_active_pct``, ``gpm_dram_bw_util_pct``, ``gpm_pcie_tx_mibps``,
``gpm_pcie_rx_mibps``, ``gpm_nvlink_tx_mibps``, ``gpm_nvlink_rx_mibps`` (MiB/s).
"""

from __future__ import annotations

import math

import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from proflab.collect import Availability
from proflab.errors import BackendUnavailable, MonitorError
from proflab.model.monitor import THROTTLE_BITS, throttle_names

__all__ = [
    "GPUMonitor",
    "MonitorSummary",
    "DeviceSummary",
    "available",
    "device_info",
    "summarize",
    "throttle_names",
    "COLUMNS",
    "DEFAULT_PERIOD_S",
]

DEFAULT_PERIOD_S = 0.1
_INSTALL = "pip install nvidia-ml-py"


# GPM metric ids (NVML_GPM_METRIC_*) and the column each fills.
GPM_METRICS = (
    (2, "gpm_sm_active_pct"),  # SM_UTIL: share of SMs busy
    (3, "gpm_sm_occupancy_pct"),  # SM_OCCUPANCY: active warps / theoretical maximum
    (5, "gpm_tensor_active_pct"),  # ANY_TENSOR_UTIL
    (10, "gpm_dram_bw_util_pct"),  # DRAM_BW_UTIL
    (20, "gpm_pcie_tx_mibps"),  # PCIE_TX_PER_SEC, MiB/s
    (21, "gpm_pcie_rx_mibps"),  # PCIE_RX_PER_SEC
    (61, "gpm_nvlink_tx_mibps"),  # NVLINK_TOTAL_TX_PER_SEC
    (60, "gpm_nvlink_rx_mibps"),  # NVLINK_TOTAL_RX_PER_SEC
)
_FI_POWER_INSTANT = 186  # NVML_FI_DEV_POWER_INSTANT, mW

_BASE_COLUMNS = (
    "device", "time_ns", "elapsed_s", "power_w", "power_instant_w", "energy_j",
    "util_gpu_pct", "util_mem_pct", "mem_used_bytes", "mem_total_bytes",
    "sm_clock_mhz", "mem_clock_mhz", "temp_c", "throttle_mask",
)  # fmt: skip
COLUMNS = _BASE_COLUMNS + tuple(c for _, c in GPM_METRICS)


def _schema() -> dict:
    import polars as pl

    types = {
        "device": pl.Int32, "time_ns": pl.Int64, "elapsed_s": pl.Float64, "power_w": pl.Float64,
        "power_instant_w": pl.Float64, "energy_j": pl.Float64, "util_gpu_pct": pl.Float64,
        "util_mem_pct": pl.Float64, "mem_used_bytes": pl.Int64, "mem_total_bytes": pl.Int64,
        "sm_clock_mhz": pl.Float64, "mem_clock_mhz": pl.Float64, "temp_c": pl.Float64,
        "throttle_mask": pl.UInt64,
    }  # fmt: skip
    types.update({c: pl.Float64 for _, c in GPM_METRICS})
    return types




def _nvml():
    try:
        import pynvml
    except ImportError as e:
        raise BackendUnavailable(f"the GPU monitor needs nvidia-ml-py ({_INSTALL})") from e
    return pynvml


def _nvml_error(call: str, e: Exception) -> MonitorError:
    """The one place NVML errors become proflab errors."""
    return MonitorError(f"NVML {call} failed: {e}")


def available() -> Availability:
    """Whether NVML can sample a GPU here. Never raises; the reason says what is missing."""
    try:
        pynvml = _nvml()
    except BackendUnavailable as e:
        return Availability(False, str(e))
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return Availability(False, f"NVML cannot start ({e}): no NVIDIA driver on this machine")
    try:
        count = pynvml.nvmlDeviceGetCount()
    except Exception as e:
        return Availability(False, f"NVML cannot count GPUs ({e})")
    finally:
        _shutdown(pynvml)
    if count == 0:
        return Availability(False, "NVML sees no GPU")
    return Availability(True)


def _shutdown(pynvml) -> None:
    try:
        pynvml.nvmlShutdown()
    except Exception:  # teardown must not mask the error that led here
        pass


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def device_info() -> dict[str, Any]:
    """Driver, CUDA driver version and each GPU (name, UUID, memory, power limit, GPM support)
    as NVML reports them. Never raises: without NVML, ``{"available": False, "reason": ...}``."""
    a = available()
    if not a:
        return {"available": False, "reason": a.reason}
    pynvml = _nvml()
    try:
        pynvml.nvmlInit()
    except Exception as e:
        return {"available": False, "reason": f"NVML cannot start ({e})"}
    try:
        out: dict[str, Any] = {"available": True}
        out["driver_version"] = _try(lambda: _text(pynvml.nvmlSystemGetDriverVersion()))
        cuda = _try(pynvml.nvmlSystemGetCudaDriverVersion)
        out["cuda_driver_version"] = None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}"
        gpus = []
        for i in range(_try(pynvml.nvmlDeviceGetCount) or 0):
            try:  # a GPU outside this container's cgroup answers NO_PERMISSION here
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
            except Exception as e:
                gpus.append({"index": i, "error": str(_nvml_error("nvmlDeviceGetHandleByIndex", e))})
                continue
            mem = _try(lambda: pynvml.nvmlDeviceGetMemoryInfo(h).total)
            limit = _try(lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h))
            # the board's own default: a limit at it is not one someone lowered (rules.energy)
            default = _try(lambda: pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h))
            gpus.append(
                {
                    "index": i,
                    "name": _try(lambda: _text(pynvml.nvmlDeviceGetName(h))),
                    "uuid": _try(lambda: _text(pynvml.nvmlDeviceGetUUID(h))),
                    "memory_total_bytes": mem,
                    "power_limit_w": None if limit is None else limit / 1000,
                    "power_limit_default_w": None if default is None else default / 1000,
                    "gpm_supported": bool(_try(lambda: pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)),
                }
            )
        out["gpus"] = gpus
        return out
    finally:
        _shutdown(pynvml)


def _try(fn):
    try:
        return fn()
    except Exception:
        return None


@dataclass(frozen=True)
class DeviceSummary:
    """One GPU over the monitored window. Power in W, energy in J, clocks in MHz, traffic in
    MiB/s; GPM means are null where the device has no GPM."""

    device: int
    samples: int
    mean_power_w: float | None
    max_power_w: float | None
    energy_j: float | None
    energy_source: str  # "counter" (NVML total-energy counter) or "integrated power"
    energy_integrated_j: float | None  # trapezoid of power_w over time: a cross-check
    mean_util_gpu_pct: float | None
    max_mem_used_bytes: int | None
    mean_sm_clock_mhz: float | None
    max_temp_c: float | None
    throttle: tuple[str, ...]  # every reason seen in any sample, gpu_idle excluded
    gpm: dict[str, float | None]


@dataclass(frozen=True)
class MonitorSummary:
    """The monitored window over all GPUs: ``energy_j`` and ``mean_power_w`` add up the
    devices; ``max_power_w`` is the highest per-tick sum; utilisation and GPM are device means."""

    duration_s: float
    period_s: float
    samples: int
    devices: tuple[DeviceSummary, ...]
    mean_power_w: float | None
    max_power_w: float | None
    energy_j: float | None
    mean_util_gpu_pct: float | None
    gpm: dict[str, float | None]
    mean_sample_cost_ms: float | None = None  # time one tick took in the sampling thread

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _r(v, nd=3):
    return None if v is None else round(float(v), nd)


def summarize(samples, *, duration_s: float | None = None, period_s: float = DEFAULT_PERIOD_S,
              sample_cost_ms: float | None = None) -> MonitorSummary:
    """Summary statistics of a ``samples`` frame (the columns in :data:`COLUMNS`)."""
    import polars as pl

    devices = []
    if samples.height:
        for (dev,), d in samples.sort("device", "time_ns").group_by("device", maintain_order=True):
            devices.append(_device_summary(int(dev), d))
    if duration_s is None:
        duration_s = float(samples["elapsed_s"].max() or 0.0) if samples.height else 0.0
    powers = [d.mean_power_w for d in devices if d.mean_power_w is not None]
    energies = [d.energy_j for d in devices if d.energy_j is not None]
    utils = [d.mean_util_gpu_pct for d in devices if d.mean_util_gpu_pct is not None]
    max_total = None
    if samples.height and samples["power_w"].null_count() < samples.height:
        # ticks share one time_ns per device loop; group by tick index per device
        per_tick = samples.with_columns(pl.int_range(pl.len()).over("device").alias("_tick"))
        max_total = per_tick.group_by("_tick").agg(pl.col("power_w").sum())["power_w"].max()
    gpm = {}
    for _, col in GPM_METRICS:
        vals = [d.gpm[col] for d in devices if d.gpm.get(col) is not None]
        gpm[col] = _r(sum(vals) / len(vals)) if vals else None
    return MonitorSummary(
        duration_s=round(duration_s, 3),
        period_s=period_s,
        samples=samples.height,
        devices=tuple(devices),
        mean_power_w=_r(sum(powers)) if powers else None,
        max_power_w=_r(max_total),
        energy_j=_r(sum(energies)) if energies else None,
        mean_util_gpu_pct=_r(sum(utils) / len(utils)) if utils else None,
        gpm=gpm,
        mean_sample_cost_ms=_r(sample_cost_ms, 4),
    )


def _device_summary(dev: int, d) -> DeviceSummary:
    import polars as pl

    def mean(c):
        s = d[c].drop_nulls()
        return _r(s.mean()) if s.len() else None

    def mx(c):
        s = d[c].drop_nulls()
        return s.max() if s.len() else None

    p = d.select("elapsed_s", "power_w").drop_nulls()
    integrated = _trapezoid_j(p["power_w"], p["elapsed_s"]) if p.height >= 2 else None
    counter = d["energy_j"].drop_nulls()
    if counter.len():
        energy, source = float(counter.max()), "counter"
    else:
        energy, source = integrated, "integrated power"
    masks = d["throttle_mask"].drop_nulls()
    seen = 0
    for m in masks.unique().to_list():
        seen |= int(m)
    return DeviceSummary(
        device=dev,
        samples=d.height,
        mean_power_w=mean("power_w"),
        max_power_w=_r(mx("power_w")),
        energy_j=_r(energy),
        energy_source=source,
        energy_integrated_j=_r(integrated),
        mean_util_gpu_pct=mean("util_gpu_pct"),
        max_mem_used_bytes=None if mx("mem_used_bytes") is None else int(mx("mem_used_bytes")),
        mean_sm_clock_mhz=mean("sm_clock_mhz"),
        max_temp_c=_r(mx("temp_c")),
        throttle=tuple(n for n in (throttle_names(seen) or []) if n != "gpu_idle"),
        gpm={c: mean(c) for _, c in GPM_METRICS if d.schema[c] != pl.Null},
    )


class _Device:
    """One GPU's NVML handle and what it turned out to support."""

    def __init__(self, pynvml, index: int) -> None:
        self.index = index
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.unsupported: set[str] = set()
        self.energy0_mj: int | None = None
        self.gpm_samples = None  # [previous, current] nvmlGpmSample_t while GPM is on
        self.gpm_get = None


class GPUMonitor:
    """Sample every GPU through NVML in a background thread.

    Use as a context manager (or ``start()`` / ``stop()``; ``stop()`` is safe to call twice)::

        with GPUMonitor(period_s=0.1) as mon:
            train()
        print(mon.summary())        # MonitorSummary: power W, energy J, utilisation, GPM
        mon.samples                 # polars DataFrame, one row per device per tick

    ``devices``: NVML indices to sample (default: all). ``gpm``: read GPM metrics where the
    device supports them (default True).
    """

    def __init__(self, period_s: float = DEFAULT_PERIOD_S, *, devices: list[int] | None = None, gpm: bool = True) -> None:
        if period_s <= 0:
            from proflab.errors import UsageError

            raise UsageError(f"monitor period must be > 0 s, got {period_s}")
        self.period_s = float(period_s)
        self.gpm = gpm
        self.errors: list[str] = []
        self._want = devices
        self._devices: list[_Device] = []
        self._cols: dict[str, list] = {c: [] for c in COLUMNS}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._t0_ns = 0
        self._t1_ns: int | None = None
        self._cost_ns = 0
        self._ticks = 0
        self._frame = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> GPUMonitor:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> GPUMonitor:
        if self._thread is not None:
            return self
        pynvml = _nvml()
        try:
            pynvml.nvmlInit()
        except Exception as e:
            raise BackendUnavailable(f"the GPU monitor cannot start NVML ({e}): no NVIDIA driver on this machine") from e
        self._nvml = pynvml
        try:
            count = pynvml.nvmlDeviceGetCount()
            indices = self._want if self._want is not None else list(range(count))
            for i in indices:
                if not 0 <= i < count:
                    raise MonitorError(f"GPU {i} does not exist (NVML sees {count})")
                self._devices.append(_Device(pynvml, i))
            for d in self._devices:
                d.energy0_mj = self._call(d, "energy", pynvml.nvmlDeviceGetTotalEnergyConsumption, d.handle)
                if self.gpm:
                    self._gpm_setup(d)
        except pynvml.NVMLError as e:
            self._teardown()
            raise _nvml_error("start", e) from e
        except BaseException:
            self._teardown()
            raise
        self._t0_ns = time.perf_counter_ns()
        self._sample()  # a first row at t=0, so that short windows still integrate
        self._thread = threading.Thread(target=self._run, name="proflab-gpu-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> GPUMonitor:
        """Stop sampling (one last sample first) and release NVML. Safe to call twice."""
        if self._thread is not None and self._t1_ns is None:
            self._stop.set()
            self._thread.join()
            self._sample()
            self._t1_ns = time.perf_counter_ns()
        self._teardown()
        return self

    def _teardown(self) -> None:
        pynvml, self._nvml = self._nvml, None
        if pynvml is None:
            return
        for d in self._devices:
            for s in d.gpm_samples or ():
                _try(lambda s=s: pynvml.nvmlGpmSampleFree(s))
            d.gpm_samples = None
        _shutdown(pynvml)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._t1_ns is None

    # -- sampling ----------------------------------------------------------------------------

    def _run(self) -> None:
        next_t = time.perf_counter() + self.period_s
        while not self._stop.wait(max(0.0, next_t - time.perf_counter())):
            self._sample()
            next_t += self.period_s
            now = time.perf_counter()
            if next_t < now:  # fell behind (suspended, overloaded): skip, do not burst
                next_t = now + self.period_s

    def _call(self, d: _Device, metric: str, fn, *args):
        """One NVML read; NOT_SUPPORTED switches the metric off for this device for good."""
        if metric in d.unsupported:
            return None
        pynvml = self._nvml
        try:
            return fn(*args)
        except pynvml.NVMLError_NotSupported:
            d.unsupported.add(metric)
        except pynvml.NVMLError as e:
            if len(self.errors) < 20:
                self.errors.append(str(_nvml_error(f"{metric} on GPU {d.index}", e)))
        return None

    def _sample(self) -> None:
        pynvml = self._nvml
        if pynvml is None:
            return
        t_start = time.perf_counter_ns()
        rows = []
        for d in self._devices:
            h = d.handle
            power = self._call(d, "power", pynvml.nvmlDeviceGetPowerUsage, h)
            energy = self._call(d, "energy", pynvml.nvmlDeviceGetTotalEnergyConsumption, h)
            util = self._call(d, "util", pynvml.nvmlDeviceGetUtilizationRates, h)
            mem = self._call(d, "memory", pynvml.nvmlDeviceGetMemoryInfo, h)
            row = {
                "device": d.index,
                "time_ns": time.time_ns(),
                "elapsed_s": (t_start - self._t0_ns) / 1e9,
                "power_w": None if power is None else power / 1000,
                "power_instant_w": self._instant_power(d),
                "energy_j": None if energy is None or d.energy0_mj is None else (energy - d.energy0_mj) / 1000,
                "util_gpu_pct": None if util is None else float(util.gpu),
                "util_mem_pct": None if util is None else float(util.memory),
                "mem_used_bytes": None if mem is None else int(mem.used),
                "mem_total_bytes": None if mem is None else int(mem.total),
                "sm_clock_mhz": _f(self._call(d, "sm_clock", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)),
                "mem_clock_mhz": _f(self._call(d, "mem_clock", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)),
                "temp_c": _f(self._call(d, "temp", pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)),
                "throttle_mask": self._throttle(d),
            }
            row.update(self._gpm_read(d))
            rows.append(row)
        with self._lock:
            for row in rows:
                for c in COLUMNS:
                    self._cols[c].append(row.get(c))
            self._cost_ns += time.perf_counter_ns() - t_start
            self._ticks += 1
            self._frame = None

    def _instant_power(self, d: _Device) -> float | None:
        pynvml = self._nvml
        vals = self._call(d, "power_instant", pynvml.nvmlDeviceGetFieldValues, d.handle, [_FI_POWER_INSTANT])
        if vals is None:
            return None
        v = vals[0]
        if v.nvmlReturn != pynvml.NVML_SUCCESS:
            d.unsupported.add("power_instant")  # old drivers answer per field, not per call
            return None
        return v.value.uiVal / 1000

    def _throttle(self, d: _Device) -> int | None:
        pynvml = self._nvml
        # The "event reasons" call replaced "throttle reasons" (same bits); older bindings lack it.
        fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return self._call(d, "throttle", fn, d.handle)

    def _gpm_setup(self, d: _Device) -> None:
        pynvml = self._nvml
        if not hasattr(pynvml, "nvmlGpmQueryDeviceSupport"):
            return
        support = self._call(d, "gpm", pynvml.nvmlGpmQueryDeviceSupport, d.handle)
        if support is None or not support.isSupportedDevice:
            return
        samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
        d.gpm_samples = samples
        pynvml.nvmlGpmSampleGet(d.handle, samples[0])
        get = pynvml.c_nvmlGpmMetricsGet_t()
        get.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(GPM_METRICS)
        for i, (metric_id, _) in enumerate(GPM_METRICS):
            get.metrics[i].metricId = metric_id
        d.gpm_get = get

    def _gpm_read(self, d: _Device) -> dict[str, float | None]:
        if d.gpm_samples is None or "gpm" in d.unsupported:
            return {}
        pynvml = self._nvml
        prev, cur = d.gpm_samples
        if self._call(d, "gpm", pynvml.nvmlGpmSampleGet, d.handle, cur) is None:
            return {}
        get = d.gpm_get
        get.sample1, get.sample2 = prev, cur
        for i, (metric_id, _) in enumerate(GPM_METRICS):
            get.metrics[i].metricId = metric_id  # NVML may rewrite the entries; set them each time
        d.gpm_samples = [cur, prev]  # this sample is the next interval's start
        if self._call(d, "gpm", pynvml.nvmlGpmMetricsGet, get) is None:
            return {}
        out = {}
        for i, (_, col) in enumerate(GPM_METRICS):
            m = get.metrics[i]
            v = float(m.value) if m.nvmlReturn == pynvml.NVML_SUCCESS else None
            # NVML can answer success with NaN (DRAM bandwidth utilisation on an H200): missing, not a number
            out[col] = v if v is not None and math.isfinite(v) else None
        return out

    # -- results -----------------------------------------------------------------------------

    @property
    def samples(self):
        """Every sample so far as a polars DataFrame (the columns in :data:`COLUMNS`)."""
        import polars as pl

        with self._lock:
            if self._frame is None:
                df = pl.DataFrame({c: self._cols[c] for c in COLUMNS}, schema=_schema())
                self._frame = df.with_columns(_throttle_expr())
            return self._frame

    @property
    def duration_s(self) -> float:
        end = self._t1_ns if self._t1_ns is not None else time.perf_counter_ns()
        return (end - self._t0_ns) / 1e9 if self._t0_ns else 0.0

    def summary(self) -> MonitorSummary:
        """Mean/max power (W), energy (J), utilisation, GPM means over the monitored window."""
        cost = self._cost_ns / self._ticks / 1e6 if self._ticks else None
        return summarize(self.samples, duration_s=self.duration_s, period_s=self.period_s, sample_cost_ms=cost)

    def get_summary(self) -> dict[str, Any]:
        """The summary as a plain dict (the name the seeds' ``easy_profiler`` used)."""
        return self.summary().to_dict()

    def write_parquet(self, path: str | Path) -> Path:
        """Write ``samples`` to ``path`` atomically (a temporary file, then a rename)."""
        from proflab.collect.rundir import atomic_path

        path = Path(path)
        with atomic_path(path) as tmp:
            self.samples.write_parquet(tmp)
        return path


def _throttle_expr():
    """``throttle_mask`` decoded into a list of reason names, vectorised."""
    import polars as pl

    mask = pl.col("throttle_mask")
    names = pl.concat_list([pl.when((mask & bit) != 0).then(pl.lit(name)) for bit, name in THROTTLE_BITS])
    return pl.when(mask.is_null()).then(None).otherwise(names.list.drop_nulls()).alias("throttle")


def _trapezoid_j(power_w, elapsed_s) -> float:
    """Energy (J) as the trapezoid integral of power (W) over time (s)."""
    import numpy as np

    p, t = np.asarray(power_w, dtype=float), np.asarray(elapsed_s, dtype=float)
    return float(np.sum((p[1:] + p[:-1]) / 2 * np.diff(t)))


def _f(v) -> float | None:
    return None if v is None else float(v)
