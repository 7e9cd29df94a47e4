"""The MLflow schema's names: experiments, and every tag a run or a model version carries.

Params and metrics are built in one place too (`records.py`); the tags are named here so that the code that writes
a tag and the code that reads it back (resume, the dataset, the registry, the UI test) spell it once.
"""
from __future__ import annotations

# Experiments.
SWEEP_EXPERIMENT = "dvfs-sweep"
GOVERNOR_EXPERIMENT = "dvfs-governor"
FINETUNE_EXPERIMENT = "dvfs-finetune"
EVALUATE_EXPERIMENT = "dvfs-evaluate"

# MLflow's own.
TAG_PARENT = "mlflow.parentRunId"
TAG_RUN_NAME = "mlflow.runName"

# Every run a command writes (mlops/lifecycle.py).
TAG_END_REASON = "dvfs.end_reason"  # a run that did not end FINISHED: the signal, or the exception's type and first line
TAG_PROCESS = "dvfs.process"  # JSON: the process a sweep's parent run belongs to (machine, pid, its start)

# A sweep point (and a sweep's parent run).
TAG_WORKLOAD = "dvfs.workload"  # MODEL/TASK plus the variant (+lora-r8a16+bf16) where the job is not a full fp32 one
TAG_POINT = "dvfs.point"  # workload@freq#repeat: the resume key
TAG_SWEEP = "dvfs.sweep_id"
TAG_SIMULATED = "dvfs.simulated"
TAG_TRAIN_ONCE = "dvfs.sim_train_once"  # the twin: "true" on a point that charged another clock's trained steps again
TAG_TRAIN_ONCE_BEFORE = "dvfs.sim_replay"  # the same tag as runs logged before it was named for what it does
TAG_PROFILE_ONLY = "dvfs.profile_only"
TAG_DEVICE_ID = "dvfs.device_id"  # which board: the Jetson's serial, the NVML GPU's UUID, sim@HOST; --device-id
TAG_DEVICE_PROFILE = "dvfs.device_profile"  # on a sweep's parent run
TAG_BOARD_FAMILY = "dvfs.board_family"  # on a sweep's parent run
TAG_SWEEP_KIND = "dvfs.sweep_kind"  # on a sweep's parent run: "calibration" for a calibration's sweeps (else absent)
CALIBRATION_SWEEP = "calibration"
# (the same tag names the board family of a governor's run and version and of a fine-tune run: mlops/registry.py)
TAG_STRATEGY = "dvfs.strategy"  # adaptive: the point was chosen by the curve model (sweep/adaptive.py)
TAG_PREDICTIONS = "dvfs.predictions"  # an adaptive sweep's parent: predicted.csv is the curve model's, not measurements
TAG_POWER_PRIOR = "dvfs.power_prior"  # an adaptive sweep's parent: the board priors its predictions leaned on
TAG_CLAIM_LOST = "dvfs.claim_lost"  # "true": a point's run whose claim another worker took over (claims.py)
# A point's run that is its claim (claims.TrackingClaims: workers that share only the tracking server).
TAG_CLAIM_WORKER = "dvfs.claim_worker"  # who claimed the point (claims.default_worker)
TAG_CLAIM_TTL = "dvfs.claim_ttl_s"  # the claim's lease: stale once its beat is seen unchanged this long
TAG_CLAIM_BEAT = "dvfs.claim_beat"  # a counter the holder bumps every third of the lease
TAG_CLAIM_PROCESS = "dvfs.claim_process"  # JSON: the claiming process (machine, pid, its start), judged on that machine

# What a metered session saw (every run that metered one).
TAG_CLOCK_HELD = "dvfs.clock_held"  # "false" on a pinned run whose measured clock strayed from the pin
TAG_OBSERVE = "dvfs.observe"  # "true": metered only, nothing written to the clocks
TAG_METER_DEGRADED = "dvfs.meter_degraded"  # "true": more than 1 % of power samples failed
TAG_ABOVE_MODE_CAP = "dvfs.above_mode_cap"  # "true": pinned above the nvpmodel mode's GPU cap
TAG_CAP_AT_START = "dvfs.cap_at_start"  # MHz: the GPU's max_freq read below the mode's (or the table's) top at the start
TAG_POWER_MODE = "dvfs.power_mode"  # the nvpmodel mode's identity (Board.power_mode_key) where it is not MAXN
TAG_CLOCK_LOST = "dvfs.clock_lost"  # "true": the clock service was lost during the session (the clock not held meanwhile)

# A run measured on a replay device (`--device replay --trace FILE`): its measurements were looked up, not made.
TAG_DEVICE = "dvfs.device"  # "replay"
TAG_TRACE_SHA256 = "dvfs.trace_sha256"  # the SHA-256 of the grid's file
TAG_TRACE_NAME = "dvfs.trace_name"  # the grid's name (the file's stem: the board it was measured on)

# A fine-tune run (and the user's run under DvfsCallback): the governor and its decision.
TAG_GOVERNOR_NAME = "governor.name"
TAG_GOVERNOR_VERSION = "governor.version"
TAG_GOVERNOR_ALIAS = "governor.alias"
TAG_GOVERNOR_URI = "governor.uri"
TAG_DECISION_PATH = "decision.path"
TAG_REFINE_SIMULATED = "refine.simulated"
TAG_DECISION_REASON = "decision.reason"  # why no governor of the board's family decided (decision.path "refine")
TAG_OTHER_BOARD = "governor.other_board"  # "true": a governor of another board family, applied with --allow-other-board
REFINE_PREFIX = "refine."  # refine.start_mhz, chosen_mhz, probes, probe_steps, reason, power_prior (records.refine_tags)
TAG_CALLBACK_FREQ = "dvfs.freq_mhz"  # DvfsCallback: the clock the job ran at
TAG_CALLBACK_PRECISION = "dvfs.precision"
TAG_CALLBACK_TRAINABLE = "dvfs.trainable_params"

# A governor's training run and its registered version.
TAG_OBJECTIVE = "objective"
TAG_VERSION_PROFILE = "device_profile"
TAG_VERSION_SWEEP = "sweep_id"
TAG_N_WORKLOADS = "n_workloads"
TAG_FAMILY = "family"  # curve | classifier | configurations
TAG_VERSION_KNOBS = "knobs"  # the clocks a version decides: gpu,cpu,emc for a governor of configurations (absent: gpu)
TAG_VERSION_ENERGY_METRIC = "energy_metric"  # ... and the energy its regrets are judged on, with its rails
TAG_VERSION_ENERGY_RAILS = "energy_rails"
TAG_CV_SPLIT = "cv_split"
TAG_OPTUNA_STUDY = "optuna.study"
TAG_OPTUNA_TRIAL = "optuna.trial"
TAG_VERSION_POWER_PRIOR = "power_prior"  # the training sweep's board prior (JSON), for refine at launch
TAG_BASELINE = "dvfs.baseline"  # "true": the published tree (registry bootstrap); metric gates do not apply
TAG_SOURCE = "source"
TAG_CALIBRATED_FROM = "calibrated_from"  # a calibrated version (`dvfs-mlops calibrate`): its source version's number
TAG_CALIBRATION_SWEEP = "calibration_sweep"  # ... and the sweep(s) that measured this board for it

# A job on several GPUs (`dvfs-mlops run`, DvfsCallback under torchrun): how many, and each GPU by its key
# (`hw.multi.GpuEnergy.key`: "<host>/<uuid>", as the per-GPU metrics `records.gpu_metrics` <metric>/<host>/<uuid>).
TAG_GPU_COUNT = "dvfs.gpu_count"
TAG_GPU_INDEX = "dvfs.gpu.{key}.index"  # .format(key=GpuEnergy.key): the GPU's NVML index on its node
TAG_GPU_RANK = "dvfs.gpu.{key}.rank"  # .format(key=GpuEnergy.key): the launcher's rank that trained on it
