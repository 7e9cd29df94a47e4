"""`DvfsCallback`: the governor inside a user's own transformers `Trainer` script.

    from dvfs_mlops.integrations.transformers import DvfsCallback
    with DvfsCallback(governor="models:/dvfs-governor@production", device="auto") as dvfs:
        trainer = Trainer(..., callbacks=[dvfs])
        trainer.train()
    print(dvfs.report.energy_j)

On train begin it computes the workload's features from the model and the training data,
asks the governor for a clock, pins it and starts metering; on train end it restores the clock
and logs the energy into the Trainer's MLflow run when one is active. The `with` block (and an
atexit hook) guarantees the restore when training raises, which Trainer callbacks never see.

Before any clock is touched it checks that the model sits on the backend's GPU (Trainer puts it
on `args.device`): a jetson/nvml clock pinned while the model trains on the CPU is refused.
`observe=True` meters without writing any clock (no root needed). The metered window is
`train()` from its first to its last step, evaluation inside it (eval_strategy) included.
`refine=N` spends N steps probing clocks around the governor's and runs the rest at the curve model's
optimum (`dvfs_mlops/job/refine.py`); `dvfs.refined` holds the probes and the choice.

LoRA and mixed precision are read from what the Trainer runs: a model wrapped with peft's
`get_peft_model` (LoRA) is seen as such (`trainable_params`, and the twin traces the LoRA step), and
`TrainingArguments(bf16=True)` / `fp16=True` is the workload's `precision`.
"""
from __future__ import annotations

import atexit
import logging
from typing import Any

from transformers import TrainerCallback

from dvfs_mlops.clocks import FreqRequest
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.job.workloads.adapters import count_base, count_trainable, peft_of
from dvfs_mlops.job.workloads.zoo import ENCODER_TYPES
from dvfs_mlops.model.workload import WorkloadFeatures

logger = logging.getLogger(__name__)

def _dataset_avg_len(dataset: Any, limit: int = 2000) -> float | None:
    """Mean unpadded length of the first `limit` training examples (input_ids / attention_mask)."""
    if dataset is None:
        return None
    total, n = 0, 0
    try:
        for i in range(min(limit, len(dataset))):
            item = dataset[i]
            if "attention_mask" in item:
                total += int(sum(int(x) for x in item["attention_mask"]))
            elif "input_ids" in item:
                total += len(item["input_ids"])
            else:
                return None
            n += 1
    except (TypeError, KeyError, IndexError):
        return None
    return total / n if n else None


class DvfsCallback(TrainerCallback):
    def __init__(self, governor: str | None = None, device: Any = "auto", freq: FreqRequest | None = None,
                 gpu_util_pct: float | None = None, avg_seq_len: float | None = None, sample_hz: float = 50.0,
                 announce: Any = logger.info, observe: bool = False, torch_device: str | None = None, refine: int = 0):
        self.governor_uri = governor
        self._device_arg = device
        self.freq_override = freq
        self.gpu_util_pct = gpu_util_pct
        self.avg_seq_len = avg_seq_len
        self.sample_hz = sample_hz
        self.observe = observe
        self.torch_device = torch_device
        self.refine = refine
        self._refiner: Any = None
        self.announce = announce or (lambda _m: None)
        self.device: Any = None
        self.session: Any = None
        self.decision: dict[str, Any] = {}
        self.features: WorkloadFeatures | None = None
        self.report: Any = None
        self._trace: Any = None
        self._run_id: str | None = None
        self._atexit_registered = False
        self._closed_session: Any = None
        self.precision = "fp32"  # from the Trainer's arguments (bf16=True / fp16=True) on train begin

    # context manager: restore even when trainer.train() raises ---------------------------------
    def __enter__(self) -> DvfsCallback:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool:
        self.close()
        return False

    def close(self) -> None:
        """Stop metering and restore the clock if a session is open (idempotent)."""
        if self.session is not None:
            session, self.session = self.session, None
            session.__exit__(None, None, None)
            self.report = session.report()
            self._closed_session = session

    # Trainer hooks ---------------------------------------------------------------------------------
    def _open_device(self) -> Any:
        if not isinstance(self._device_arg, str):
            return self._device_arg
        from dvfs_mlops.hw import open_device

        return open_device(self._device_arg, sample_hz=self.sample_hz, announce=self.announce)

    def _features(self, model: Any, train_dataloader: Any, batch_size: int) -> WorkloadFeatures:
        cfg = model.config
        layers = next((getattr(cfg, k) for k in ("num_hidden_layers", "n_layer", "num_layers") if getattr(cfg, k, None)), None)
        hidden = next((getattr(cfg, k) for k in ("hidden_size", "d_model", "n_embd") if getattr(cfg, k, None)), None)
        if layers is None or hidden is None:
            raise DvfsError(f"cannot compute the governor's features: {type(cfg).__name__} has no layer count or hidden size")
        avg = self.avg_seq_len or _dataset_avg_len(getattr(train_dataloader, "dataset", None))
        if avg is None:
            raise DvfsError("cannot compute avg_seq_len from the training data (no input_ids/attention_mask); pass DvfsCallback(avg_seq_len=...)")
        trainable = count_trainable(model)
        lora = peft_of(model).is_lora  # a peft-wrapped model: its frozen base is num_params, what trains is trainable_params
        params = count_base(model) if lora else trainable
        mtype = "encoder" if getattr(cfg, "model_type", "") in ENCODER_TYPES else "decoder"
        return WorkloadFeatures(mtype, int(layers), int(hidden), int(params), float(avg), self.gpu_util_pct, int(trainable),
                                self.precision)

    def _twin_trace(self, model: Any, batch_size: int, avg_len: float) -> Any:
        from dvfs_mlops.hw.twin.trace import TraceCache
        from dvfs_mlops.job.finetune import PRECISIONS

        padded = max(8, -(-int(round(avg_len)) // 8) * 8)
        kind = "causal_lm" if type(model).__name__.endswith("ForCausalLM") else "classification"  # an LM head is traced as one
        return TraceCache().get(model.config, batch_size, padded, PRECISIONS[self.precision], int(getattr(model.config, "num_labels", 2)),
                                peft_of(model), kind=kind)

    def _check_placement(self, model: Any) -> None:
        from dvfs_mlops.hw.placement import TorchDeviceError, resolve_torch_device

        wanted = resolve_torch_device(self.device, self.torch_device)  # CUDA missing: one clear error
        try:
            actual = str(next(model.parameters()).device)
        except (StopIteration, AttributeError):
            return
        if wanted.split(":")[0] != actual.split(":")[0]:
            raise TorchDeviceError(f"the model is on {actual} but the {self.device.name} backend meters {wanted}: the clock would "
                                   f"be pinned on a GPU that does not train; let Trainer place the model (TrainingArguments "
                                   f"use_cpu=False) or pass DvfsCallback(torch_device={actual!r}) on purpose")

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, train_dataloader: Any = None, **kwargs: Any) -> None:
        import mlflow

        self.device = self._open_device()
        if model is not None:
            self._check_placement(model)
        batch = int(getattr(args, "per_device_train_batch_size", 8))
        self.precision = "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else "fp32"
        feats = self._features(model, train_dataloader, batch)
        if self.device.simulated or feats.gpu_util_pct is None:
            self._trace = self._twin_trace(model, batch, feats.avg_seq_len)
        if feats.gpu_util_pct is None:  # the twin's estimate at maxn
            from dvfs_mlops.hw.sim import SimDevice

            feats = feats.with_gpu_util(100.0 * SimDevice().curve(self._trace)[1].gpu_util)
        self.features = feats
        if self.freq_override is not None:
            freq, path, meta = self.freq_override, f"fixed by the caller: {self.freq_override}", {"uri": None, "tags": {}}
        else:
            from dvfs_mlops.app.finetune import check_profile, decide
            from dvfs_mlops.mlops.registry import resolve

            gov, meta = resolve(self.governor_uri)
            check_profile(meta, self.device, False, self.announce)
            freq, path = decide(gov, meta, feats, self.device.frequencies_mhz)
        self.decision = {"freq": freq, "path": path, "governor": {k: v for k, v in meta.items() if k != "tags"}}
        self.announce(f"dvfs: {path} on {self.device.name}" + (" (SIMULATED)" if self.device.simulated else ""))
        active = mlflow.active_run()
        self._run_id = active.info.run_id if active else None
        session = self.device.session(freq, observe=self.observe, **({"noise_key": "trainer"} if self.device.simulated else {}))
        session.__enter__()
        self.session = session
        session.begin_window("train")
        if self.refine and not self.observe:
            from dvfs_mlops.job.refine import Refiner, prior_from_governor

            self._refiner = Refiner(session, self.refine, int(getattr(state, "max_steps", 0) or 0), say=self.announce,
                                    prior=prior_from_governor(meta, self.device.profile))
        if not self._atexit_registered:
            atexit.register(self.close)
            self._atexit_registered = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session is not None and self.device is not None and self.device.simulated:
            self.session.step(self._trace)
        if self.session is not None and self._refiner is not None:
            self._refiner.on_step(int(getattr(state, "global_step", 1)) - 1)

    @property
    def refined(self) -> Any:
        """The probes and the settled clock (`refine.RefineResult`), None without refine."""
        return self._refiner.result if self._refiner is not None else None

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()
        if self.report is not None and self._run_id:
            self._log(self._run_id)

    def _log(self, run_id: str) -> None:
        from dvfs_mlops.mlops import tracking

        r = self.report
        metrics = {"dvfs_energy_j": r.energy_j, "dvfs_energy_total_j": r.energy_total_j, "dvfs_avg_power_w": r.avg_power_w,
                   "dvfs_peak_power_w": r.peak_power_w, "dvfs_time_s": r.duration_s, "dvfs_gpu_util_pct": r.gpu_util_pct,
                   "dvfs_clock_mhz_measured": r.clock_mhz_measured,
                   "dvfs_clock_held": None if r.clock_held is None else float(r.clock_held),
                   "dvfs_samples_failed": float(r.samples_failed)}
        g = self.decision.get("governor", {})
        tags = {"dvfs.freq_mhz": str(self.decision.get("freq")), "decision.path": str(self.decision.get("path")),
                "governor.uri": str(g.get("uri")), "governor.version": str(g.get("version") or ""),
                "dvfs.simulated": str(r.simulated).lower(), "dvfs.precision": self.precision}
        if self.features is not None:
            tags["dvfs.trainable_params"] = str(self.features.trainable_params)
        if self._closed_session is not None:
            from dvfs_mlops.mlops import records

            tags.update(records.session_tags(self._closed_session, r))
        if self.refined is not None:
            tags.update({**self.refined.tags(), "dvfs.freq_mhz": f"{self.refined.chosen_mhz:g}"})
        tracking.log_run_batch(tracking.client(), run_id, metrics=metrics, tags=tags)
