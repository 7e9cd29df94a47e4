"""`DvfsCallback`: the governor inside a user's own transformers `Trainer`, an adapter of the launch controller
(`mlops.launch`: decide, pin, warm-up and training windows, refine, report) with the launcher's defaults. On train
begin it reads the features from the model and the data (`trainer_job.py`), decides, pins and meters; each step moves
the windows and refine on; on train end it restores the clock and logs into the run the script has active
(`lifecycle.user_run`; none: nothing is logged). Use it as `with DvfsCallback(...) as dvfs:` (an atexit hook too): the
block restores the clock when training raises, which callbacks never see. Under a launcher each process is one rank.
"""
from __future__ import annotations

import atexit
import dataclasses
import logging
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from transformers import TrainerCallback

from dvfs_mlops.clocks import FreqRequest
from dvfs_mlops.integrations import ranks, trainer_job
from dvfs_mlops.mlops.launch import Decision, Launch, Launched, LaunchOptions, decide, refine_budget

if TYPE_CHECKING:
    from transformers import PreTrainedModel, TrainerControl, TrainerState, TrainingArguments

    from dvfs_mlops.hw.board import Board
    from dvfs_mlops.hw.device import Device
    from dvfs_mlops.hw.meter import EnergyReport
    from dvfs_mlops.hw.multi import GpuEnergy
    from dvfs_mlops.job.refine import RefineResult
    from dvfs_mlops.mlops.lifecycle import OwnedRun
    from dvfs_mlops.model.workload import WorkloadFeatures

logger = logging.getLogger(__name__)


class DvfsCallback(TrainerCallback):
    """A `TrainerCallback` that runs `Trainer.train()` at the governor's clock and meters it (docs/API.md says more;
    `DvfsCallback.tuning("gpu,cpu[,emc]", ...)` tunes the CPU and memory clocks too).

    Args:
        governor: a `models:/` URI (None: the production governor of the board's family).
        device: a backend name for `open_device` (auto, jetson, nvml, sim), or an open `Device`.
        freq: pin this clock (MHz or "maxn") instead of asking the governor.
        gpu_util_pct: the GPU-utilisation feature (None: the twin's estimate at maxn).
        avg_seq_len: the average-sequence-length feature (None: the data's mean unpadded length).
        sample_hz: the meter's rate when `device` is a name (None: `open_device`'s).
        announce: where the one-line statements go (default the module logger at INFO; None: nowhere).
        observe: meter without writing any clock (no root needed); no refine.
        torch_device: where the model trains when it is not the backend's device, on purpose.
        refine: probe-and-refine's step budget (None: the launcher's default, 30 on hardware, none on the twin; 0: off).
        warmup_steps: the first steps metered apart (None: 3 on hardware, 0 on the twin; at most a quarter).
        allow_other_board: let another board family's governor decide (recorded); else such a board refines.

    Raises:
        DvfsError: on train begin, no features or no governor; any of `open_device`'s and the session's errors.
        TorchDeviceError: on train begin, the model sits on another device than the backend's; before any clock.
    """

    def __init__(self, governor: str | None = None, device: Device | str = "auto", freq: FreqRequest | None = None,
                 gpu_util_pct: float | None = None, avg_seq_len: float | None = None, sample_hz: float | None = None,
                 announce: Callable[[str], None] | None = logger.info, observe: bool = False, torch_device: str | None = None,
                 refine: int | None = None, warmup_steps: int | None = None, allow_other_board: bool = False):
        self.options = LaunchOptions(governor_uri=governor, probe_steps=0, observe=observe, refine=refine,
                                     allow_other_board=allow_other_board)
        self._device_arg, self.freq_override, self.sample_hz = device, freq, sample_hz
        self.gpu_util_pct, self.avg_seq_len, self.torch_device, self.warmup_steps = gpu_util_pct, avg_seq_len, torch_device, warmup_steps
        self.announce = announce or (lambda _m: None)
        self.device: Device | None = None
        self.board: Board | None = None
        self.decision: Decision | None = None
        self.precision = "fp32"  # from the Trainer's arguments (bf16=True / fp16=True) on train begin
        self.report: EnergyReport | None = None
        self.launched: Launched | None = None
        self.gpus: tuple[GpuEnergy, ...] = ()
        self._launch: Launch | None = None
        self._run: OwnedRun | None = None
        self._trace: Any = None
        self._step0 = 0  # global_step when this train() began (a resumed run starts past 0)
        self._group: Any = None  # torch.distributed where a process group of several ranks runs at train begin
        self._atexit = False

    @classmethod
    def tuning(cls, knobs: str, **arguments: Any) -> DvfsCallback:
        """A callback (the constructor's `arguments`) that also tunes `knobs`, "gpu,cpu" or "gpu,cpu,emc" as `finetune --knobs`
        does; a DvfsError names an unknown clock or no gpu at once, a clock the backend cannot set or refine=0 on train begin."""
        callback = cls(**arguments)
        callback.options = dataclasses.replace(callback.options, tuned=knobs)
        return callback

    def __enter__(self) -> DvfsCallback:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> Literal[False]:
        self._finish(exc)
        return False

    def close(self) -> None:
        """Stop metering and restore the clock if a session is open (idempotent); nothing is logged."""
        self._finish(None, log=False)

    @property
    def features(self) -> WorkloadFeatures | None:
        """The features the decision was made on."""
        return self.decision.features if self.decision is not None else None

    @property
    def refined(self) -> RefineResult | None:
        """The probes and the settled clock (`refine.RefineResult`), None without refine."""
        return self._launch.refined if self._launch is not None else None

    @property
    def job_report(self) -> EnergyReport | None:
        """The whole job's report: the sum over every rank's GPU under a launcher (`hw.multi.combine`), else `report`."""
        if len(self.gpus) > 1:
            from dvfs_mlops.hw.multi import combine

            return combine([g.report for g in self.gpus])
        return self.report

    def _open_device(self, model: PreTrainedModel | None = None) -> Device:
        return ranks.rank_device(self._device_arg, self.sample_hz, trainer_job.model_uuid(model, self.torch_device), self.announce)

    def _check_placement(self, model: PreTrainedModel) -> None:
        assert self.device is not None and self.board is not None
        trainer_job.check_placement(model, self.device, self.board, self.torch_device)

    def _decide_once(self, model: PreTrainedModel, batch: int, feats: WorkloadFeatures) -> Decision:
        """The decision (the caller's clock, else the governor's), by this process or by rank 0 for every rank."""
        def util() -> tuple[float | None, str]:
            if self.gpu_util_pct is not None:
                return self.gpu_util_pct, "given (gpu_util_pct)"
            from dvfs_mlops.hw.sim import SimDevice

            self._trace = self._trace or trainer_job.twin_trace(model, batch, feats.avg_seq_len, self.precision)
            return 100.0 * SimDevice().curve(self._trace)[1].gpu_util, "twin estimate"

        def make() -> Decision:
            if self.freq_override is not None:
                pct, source = util()
                return dataclasses.replace(Decision.at(self.freq_override), features=feats.with_gpu_util(pct), util_source=source)
            return decide(typing.cast("Board", self.board), self.options, feats, util, self.announce, self.device)  # set on train begin

        return ranks.decide_once(self._group, make)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model: Any = None, train_dataloader: object = None, **kwargs: Any) -> None:
        from dvfs_mlops.hw.board import board_of
        from dvfs_mlops.job.run import warmup_for
        from dvfs_mlops.mlops import lifecycle

        self._group = ranks.process_group()
        self.device = self._open_device(model)
        self.board = board = board_of(self.device, self.torch_device)  # CUDA missing: one clear error, before any clock
        if model is not None:
            self._check_placement(model)
        batch = int(getattr(args, "per_device_train_batch_size", 8))
        self.precision = trainer_job.precision_of(args)
        feats = trainer_job.features_of(model, getattr(train_dataloader, "dataset", None), self.precision, self.avg_seq_len)
        self._trace = trainer_job.twin_trace(model, batch, feats.avg_seq_len, self.precision) if self.device.simulated else None
        tables = self.options.knob_tables(self.device)  # a clock the backend cannot set: before any is touched
        self.decision = decision = self._decide_once(model, batch, feats).with_knobs_at_top(tables)
        self.announce(f"dvfs: {decision.path} on {self.device.name}" + (" (SIMULATED)" if self.device.simulated else ""))
        self._run = lifecycle.user_run()
        world = self._group.get_world_size() if self._group is not None else 1
        self._launch = Launch(self.device, board, decision, refine=refine_budget(decision, self.options, board, self.announce, world),
                              observe=self.options.observe, label="trainer", say=self.announce, knobs=tables)
        self._step0 = int(getattr(state, "global_step", 0) or 0)  # a run resumed from a checkpoint starts past 0
        max_steps = max(int(getattr(state, "max_steps", 0) or 0) - self._step0, 0)
        self._launch.begin(max_steps, warmup_for(self.warmup_steps, board.simulated, max_steps))
        if not self._atexit:
            atexit.register(self.close)
            self._atexit = True

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._launch is not None:
            self._launch.step_done(int(getattr(state, "global_step", 1)) - self._step0 - 1, self._trace)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._finish(None)

    def _finish(self, exc: BaseException | None, log: bool = True) -> None:
        """Restore the clock; gather the ranks' reports (normal end); log into the user's run (rank 0), with any reason."""
        launched = self._launch.end() if self._launch is not None else None
        if launched is None:
            return
        self.launched, self.report = launched, launched.report
        if self._group is not None and exc is None and log:
            assert self.device is not None and self.board is not None
            self.gpus = ranks.gather(self._group, self.device, self.board, self.report)
            if self._group.get_rank() != 0:
                return  # rank 0 logs the job's one run
        if log and self._run is not None and self.decision is not None and self.board is not None and self.job_report is not None:
            from dvfs_mlops.mlops import records, schema
            from dvfs_mlops.mlops.lifecycle import outcome

            record = records.callback_record(launched.session, self.job_report, self.board, self.decision, self.precision,
                                             self.refined, self.gpus)
            reason = outcome(exc)[1]
            self._run.log(record.plus(params=launched.knob_params(), tags={schema.TAG_END_REASON: reason} if reason else {}))
