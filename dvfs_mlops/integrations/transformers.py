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

Under a launcher (`torchrun`, `accelerate launch`: LOCAL_RANK is set) every process is one rank of the job. Each
rank pins and meters its own GPU: the one whose UUID torch reports for the model's CUDA device, else (the model on the
CPU, `--torch-device cpu`) the LOCAL_RANK-th GPU the job sees (`hw/multi.rank_gpu_index`). Where a process group is
initialised at train begin (Trainer does it under torchrun), rank 0 alone decides (governor, features) and broadcasts
the clock, so every rank runs at one clock; at train end the ranks gather their reports and rank 0 logs one MLflow run:
`dvfs_energy_j` is the sum of the GPUs' and each GPU's is `dvfs_energy_j_gpu<NVML index>` (with its UUID as a tag);
the other ranks log nothing. Refine is off there (each rank would settle on its own clock). A rank that dies leaves its
GPU's journal, which `dvfs-mlops restore` (or the next session on that GPU) puts back.

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
from dvfs_mlops.mlops.governor import GovernorRef
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
    """A transformers `TrainerCallback` that runs `Trainer.train()` at the governor's clock and meters it.

    Use it as a context manager around `train()` (module doc): on train begin it opens the device,
    computes the features, decides, pins and starts the "train" window; on train end (or when the
    `with` block exits, or at interpreter exit) it restores the clock.

    Args:
        governor: a `models:/` URI of the governor (None: the registry's production alias).
        device: a backend name for `open_device` (auto, jetson, nvml, sim), or an open `Device`. NVML cannot tell
            whether someone locked the GPU's clocks, so a pinned session there needs
            `open_device("nvml", assume_unlocked=True)` passed here (observe meters without it).
        freq: pin this clock (MHz or "maxn") instead of asking the governor.
        gpu_util_pct: the `gpu_util_pct` feature (None: the twin's estimate at maxn for this model and batch).
        avg_seq_len: the `avg_seq_len` feature (None: the mean unpadded length of the first 2000 training examples).
        sample_hz: the meter's sampling rate when `device` is a name.
        announce: where the one-line device and decision statements (and refine's lines) go; default the module
            logger at INFO, `print` shows them, None says nothing.
        observe: meter without writing any clock (no root needed); no refining.
        torch_device: where the model trains when it is not the backend's device, on purpose (None: the backend's).
        refine: at most this many training steps spent probing clocks around the governor's
            (`dvfs_mlops/job/refine.py`), the rest at the clock the curve model settles on; 0 is off.
        warmup_steps: the first training steps, metered apart as the window "warmup" (None: 3 on hardware, 0 on the
            twin; at most a quarter of `max_steps`): `report` is the steps after them.
        allow_other_board: let a governor of another board family decide where this board's family has none (or
            `governor` names one), recorded as `governor.other_board`; without it such a board refines from the curve
            model (`refine` at least `mlops.governor.NO_GOVERNOR_REFINE_STEPS`), saying why.

    Attributes:
        report: the `EnergyReport` of the training window (the steps after warm-up), after training (None before); this
            process's GPU's under a launcher.
        gpus: under a launcher with a process group, every rank's `hw.multi.GpuEnergy` (NVML index, UUID, rank,
            report), after training; () otherwise.
        job_report: (property) the whole job's report: the sum over `gpus` (`hw.multi.combine`), else `report`.
        decision: `freq`, `path` (the decision path) and `governor` (name, version, alias, uri).
        features: the `WorkloadFeatures` the governor decided on.
        precision: fp32, bf16 or fp16, from the Trainer's arguments.
        refined: (property) the `RefineResult` of probe-and-refine; None without refine.

    Raises:
        DvfsError: on train begin, the features cannot be computed (a model config without a layer count or hidden
            size; `avg_seq_len` not computable from the data: pass it) or the governor cannot be loaded; any of
            `open_device`'s and the session's errors.
        TorchDeviceError: on train begin, the model sits on another device than the backend's, or the backend trains
            on CUDA and torch has none; before any clock is touched.
    """

    def __init__(self, governor: str | None = None, device: Any = "auto", freq: FreqRequest | None = None,
                 gpu_util_pct: float | None = None, avg_seq_len: float | None = None, sample_hz: float = 50.0,
                 announce: Any = logger.info, observe: bool = False, torch_device: str | None = None, refine: int = 0,
                 warmup_steps: int | None = None, allow_other_board: bool = False):
        self.governor_uri = governor
        self.allow_other_board = allow_other_board
        self._decision_tags: dict[str, str] = {}  # what governor_for_board says of the decision (reason, other board)
        self.warmup_steps = warmup_steps
        self._windows: Any = None
        self._step0 = 0  # global_step when this train() began (a resumed run starts past 0)
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
        self.board: Any = None
        self.session: Any = None
        self.decision: dict[str, Any] = {}
        self.features: WorkloadFeatures | None = None
        self.report: Any = None
        self._trace: Any = None
        self._run_id: str | None = None
        self._atexit_registered = False
        self._closed_session: Any = None
        self.precision = "fp32"  # from the Trainer's arguments (bf16=True / fp16=True) on train begin
        self.gpus: tuple[Any, ...] = ()
        self._group: Any = None  # torch.distributed where a process group of several ranks runs at train begin

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
    def _open_device(self, model: Any = None) -> Any:
        from dvfs_mlops import settings
        from dvfs_mlops.hw import describe_device, open_device

        given = not isinstance(self._device_arg, str)
        local = settings.local_rank()
        if local is None:
            return self._device_arg if given else open_device(self._device_arg, sample_hz=self.sample_hz, announce=self.announce)
        dev = self._device_arg if given else open_device(self._device_arg, sample_hz=self.sample_hz)
        if dev.name == "nvml":  # under a launcher: this rank's own GPU, opened like the one given
            from dvfs_mlops.hw.multi import rank_gpu_index

            index = rank_gpu_index(dev, local, self._model_uuid(model))
            if index != dev.index:
                other = open_device("nvml", nvml_module=dev.nvml, gpu_index=index, sample_hz=dev.sample_hz,
                                    assume_unlocked=dev.assume_unlocked)
                if not given:
                    dev.close()
                dev = other
        self.announce(describe_device(dev, "" if given else self._device_arg) + f" (LOCAL_RANK {local})")
        return dev

    def _model_uuid(self, model: Any) -> str | None:
        """The UUID torch reports for the CUDA device the model is on; None off CUDA or where a torch device was named."""
        from dvfs_mlops import settings
        from dvfs_mlops.hw.placement import cuda_uuid

        try:
            actual = str(next(model.parameters()).device)
        except (StopIteration, AttributeError, TypeError):
            return None
        if not actual.startswith("cuda") or self.torch_device or settings.torch_device_override():
            return None
        return cuda_uuid(actual)

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
        """The model must sit on the board's GPU: a clock pinned on a GPU that does not train saves nothing.

        The device type must match; on nvml the CUDA device the model is on must also be the board's GPU, told by UUID
        (`placement.cuda_uuid`: torch's UUID of that device, against the GPU's own and its MIG devices'), since a CUDA
        index says nothing of which NVML GPU it is. A `torch_device` the caller named (here or $DVFS_TORCH_DEVICE) is
        taken as meant."""
        from dvfs_mlops import settings
        from dvfs_mlops.hw.placement import TorchDeviceError, bare_uuid, cuda_uuid

        wanted = self.board.torch_device
        try:
            actual = str(next(model.parameters()).device)
        except (StopIteration, AttributeError):
            return
        if wanted.split(":")[0] != actual.split(":")[0]:
            raise TorchDeviceError(f"the model is on {actual} but the {self.board.backend} backend meters {wanted}: the clock would "
                                   f"be pinned on a GPU that does not train; let Trainer place the model (TrainingArguments "
                                   f"use_cpu=False) or pass DvfsCallback(torch_device={actual!r}) on purpose")
        if self.board.backend != "nvml" or not actual.startswith("cuda") or self.torch_device or settings.torch_device_override():
            return
        ours = set(getattr(self.device, "cuda_uuids", None) or {bare_uuid(self.board.device_id)})
        found = cuda_uuid(actual)
        same = found in ours if found is not None else actual == wanted  # no UUID from torch: the resolved device itself
        if not same:
            raise TorchDeviceError(f"the model is on {actual} ({found or 'UUID unknown'}) but the nvml backend pins and meters "
                                   f"{self.board.device_id} ({wanted}): the clock would be pinned on a GPU that does not train; "
                                   f"let Trainer put the model on {wanted} (CUDA_VISIBLE_DEVICES, LOCAL_RANK), open the GPU it "
                                   f"trains on (--gpu-index), or pass DvfsCallback(torch_device={actual!r}) on purpose")

    def _decide_once(self, model: Any, batch: int, feats: WorkloadFeatures) -> tuple[WorkloadFeatures, FreqRequest, str, GovernorRef]:
        """The features (the twin's gpu_util estimate filled in) and the decision (`_decide`), made by this process, or
        under a process group by rank 0 alone and broadcast, so every rank runs at one clock.

        Raises:
            DvfsError: the decision failed (on rank 0: its own error; elsewhere one line with rank 0's).
        """
        group = self._group
        if group is None or group.get_rank() == 0:
            try:
                if feats.gpu_util_pct is None:  # the twin's estimate at maxn
                    from dvfs_mlops.hw.sim import SimDevice

                    self._trace = self._trace or self._twin_trace(model, batch, feats.avg_seq_len)
                    feats = feats.with_gpu_util(100.0 * SimDevice().curve(self._trace)[1].gpu_util)
                freq, path, ref = self._decide(feats)
            except Exception as e:
                if group is not None:
                    group.broadcast_object_list([{"error": f"{type(e).__name__}: {e}"}], src=0)
                raise
            if group is None:
                return feats, freq, path, ref
            shared = [{"features": feats, "freq": freq, "path": path, "governor": ref.to_cache()}]
        else:
            shared = [None]
        group.broadcast_object_list(shared, src=0)
        got = shared[0]
        if "error" in got:
            raise DvfsError(f"rank 0 could not decide the clock ({' '.join(got['error'].split())[:300]}); see its output")
        return got["features"], got["freq"], got["path"], GovernorRef.from_cache(got["governor"])

    def _decide(self, feats: WorkloadFeatures) -> tuple[FreqRequest, str, GovernorRef]:
        """The clock (the caller's, else the governor's for these features), the decision path, and which governor."""
        if self.freq_override is not None:
            return self.freq_override, f"fixed by the caller: {self.freq_override}", GovernorRef("")
        from dvfs_mlops.mlops.governor import governor_for_board

        chosen = governor_for_board(self.board, self.governor_uri, allow_other_board=self.allow_other_board, say=self.announce)
        if chosen.note:  # this board's family has no governor: refine picks the clock (at least its minimum budget)
            self.announce(chosen.note)
        self.refine = chosen.refine_budget(self.refine or None, 0)
        self._decision_tags = chosen.tags()
        freq, path = chosen.decide(feats, self.board)
        return freq, path, chosen.ref

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, train_dataloader: Any = None, **kwargs: Any) -> None:
        import mlflow

        from dvfs_mlops.hw.board import board_of

        self._group = _process_group()
        self.device = self._open_device(model)
        self.board = board_of(self.device, self.torch_device)  # CUDA missing: one clear error, before any clock
        if model is not None:
            self._check_placement(model)
        batch = int(getattr(args, "per_device_train_batch_size", 8))
        self.precision = "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else "fp32"
        feats = self._features(model, train_dataloader, batch)
        self._trace = None
        if self.device.simulated:
            self._trace = self._twin_trace(model, batch, feats.avg_seq_len)
        feats, freq, path, ref = self._decide_once(model, batch, feats)
        self.features = feats
        self.decision = {"freq": freq, "path": path, "governor": ref.to_dict() if ref.uri else {"uri": None},
                         "tags": self._decision_tags}
        self.announce(f"dvfs: {path} on {self.device.name}" + (" (SIMULATED)" if self.device.simulated else ""))
        active = mlflow.active_run()
        self._run_id = active.info.run_id if active else None
        session = self.device.session(freq, observe=self.observe, label="trainer")
        session.__enter__()
        self.session = session
        from dvfs_mlops.job.finetune import StepWindows
        from dvfs_mlops.job.run import warmup_for

        # steps counted from where this train() starts: a run resumed from a checkpoint starts at its global_step
        self._step0 = int(getattr(state, "global_step", 0) or 0)
        max_steps = max(int(getattr(state, "max_steps", 0) or 0) - self._step0, 0)
        cold = warmup_for(self.warmup_steps, self.board.simulated, max_steps)
        self._windows = StepWindows(session, self.board.torch_device, cold).__enter__()  # "warmup", then "train"
        if self.refine and self._group is not None:
            self.announce("refine: off under a launcher with several ranks, which would each settle on a clock of their own")
        elif self.refine and session.pinned_mhz is None:
            self.announce("refine: off, nothing is pinned (maxn or observe), so there is no clock to move")
        elif self.refine:
            from dvfs_mlops.job.refine import WARMUP_STEPS, Refiner

            self._refiner = Refiner(session, self.refine, max_steps, self.board, say=self.announce,
                                    prior=ref.power_prior_for(self.board) if ref.uri else None, warmup=max(WARMUP_STEPS, cold))
        if not self._atexit_registered:
            atexit.register(self.close)
            self._atexit_registered = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session is not None and self.device is not None and self.device.simulated:
            self.session.step(self._trace)
        step = int(getattr(state, "global_step", 1)) - self._step0 - 1  # 0 for this train()'s first step
        if self.session is not None and self._refiner is not None:
            self._refiner.on_step(step)
        if self.session is not None and self._windows is not None:
            self._windows.step_done(step)

    @property
    def refined(self) -> Any:
        """The probes and the settled clock (`refine.RefineResult`), None without refine."""
        return self._refiner.result if self._refiner is not None else None

    @property
    def job_report(self) -> Any:
        """The whole job's `EnergyReport`: the sum over every rank's GPU under a launcher (`hw.multi.combine`), else `report`."""
        if len(self.gpus) > 1:
            from dvfs_mlops.hw.multi import combine

            return combine([g.report for g in self.gpus])
        return self.report

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()
        if self._group is not None and self.report is not None:
            self.gpus = self._gather()
            if self._group.get_rank() != 0:
                return  # rank 0 logs the job's one run
        if self.report is not None and self._run_id:
            self._log(self._run_id)

    def _gather(self) -> tuple[Any, ...]:
        """Every rank's `GpuEnergy` (its power series left out), in rank order; a collective every rank calls."""
        import dataclasses

        from dvfs_mlops.hw.multi import GpuEnergy

        rank = self._group.get_rank()
        mine = GpuEnergy(int(getattr(self.device, "index", 0)), str(self.board.device_id),
                         dataclasses.replace(self.report, power_series_w=[]), rank)
        every: list[Any] = [None] * self._group.get_world_size()
        self._group.all_gather_object(every, mine)
        return tuple(sorted(every, key=lambda g: g.rank))

    def _log(self, run_id: str) -> None:
        from dvfs_mlops.mlops import records, tracking

        record = records.callback_record(self._closed_session, self.job_report, self.board, self.decision, self.features,
                                         self.precision, self.refined, self.gpus)
        record.log(tracking.client(), run_id)


def _process_group() -> Any:
    """`torch.distributed` where a process group of several ranks is initialised (Trainer's, under torchrun), else None."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None
