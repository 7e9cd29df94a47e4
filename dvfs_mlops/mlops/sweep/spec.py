"""Sweep presets and the validated definition of a sweep (`SweepSpec`, its points and its id)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dvfs_mlops.clocks import MAXN, FreqRequest, Setting, freq_label
from dvfs_mlops.errors import DvfsError, unknown
from dvfs_mlops.hw.board import Board
from dvfs_mlops.hw.device import knob_table, parse_freq, parse_knob
from dvfs_mlops.job.run import warmup_for
from dvfs_mlops.job.workloads.adapters import FULL, PeftSpec, variant_suffix
from dvfs_mlops.job.workloads.tasks import TASKS, get_task
from dvfs_mlops.job.workloads.zoo import PRESETS as MODEL_PRESETS
from dvfs_mlops.job.workloads.zoo import ModelEntry, model_entry
from dvfs_mlops.mlops.fields import parse_knobs
from dvfs_mlops.mlops.schema import SWEEP_EXPERIMENT

if TYPE_CHECKING:
    from dvfs_mlops.hw.device import Device
    from dvfs_mlops.hw.replay import ReplayGrid


@dataclasses.dataclass(frozen=True)
class SweepPreset:
    models: tuple[str, ...]
    tasks: tuple[str, ...]
    freqs: tuple[str, ...] | None  # None = the device's whole table
    steps: int
    profile_steps: int = 100
    train_size: int = 2048
    dev_size: int = 256
    repeats: int = 1


PRESETS: dict[str, SweepPreset] = {
    # 2 tiny models x 3 tasks (2 train, 1 eval) x 3 clocks + maxn, a few steps.
    "smoke": SweepPreset(("bert-tiny", "pythia-14m"), ("sst2", "mrpc", "rte"), ("510", "816", "1300.5"), steps=4, train_size=128, dev_size=64),
    # The smallest BERT and Pythia on sst2, mrpc, rte at every clock + maxn.
    "quick": SweepPreset(("bert-tiny", "pythia-14m"), ("sst2", "mrpc", "rte"), None, steps=60),
    # The study: 12 models x 9 tasks. On the twin, steps=0 profiles without training.
    "paper": SweepPreset(tuple(MODEL_PRESETS), tuple(TASKS), None, steps=0, profile_steps=200),
}


STRATEGIES = ("grid", "adaptive")
# The clocks a sweep may tune (`--knobs`), in the order a configuration names them: the GPU's always, with the CPU's
# (cpufreq) and the memory's (EMC) where the device sets them. Not the job's settings of `--knob NAME=VALUE`.
CLOCK_KNOBS = ("gpu", "cpu", "emc")
# Each tunable clock besides the GPU's: the device's table attribute key (hw.device.KNOBS) and its option here.
_KNOB_TABLES = {"cpu": ("cpu_mhz", "--cpu-freqs"), "emc": ("emc_mhz", "--emc-freqs")}


@dataclasses.dataclass(frozen=True)
class Point:
    """One measurement of a sweep: a workload at a configuration, one repeat.

    Attributes:
        model, task: the workload.
        freq: the GPU clock (MHz) or "maxn" (every clock as the board runs it by default).
        repeat: the repeat.
        variant: "+lora-r8a16+bf16": how the model is adapted and in which precision ('' = full, fp32).
        cpu_mhz: the CPU clock pinned with it (a sweep tuning `cpu`); None: left alone.
        emc_mhz: the memory (EMC) clock pinned with it (a sweep tuning `emc`); None: left alone.
    """

    model: str
    task: str
    freq: FreqRequest
    repeat: int
    variant: str = ""
    cpu_mhz: float | None = None
    emc_mhz: float | None = None

    @property
    def workload(self) -> str:
        """MODEL/TASK plus the variant; a replayed grid's workload (no task) is its name as the file writes it."""
        return f"{self.model}/{self.task}{self.variant}" if self.task else self.model

    @property
    def clocks(self) -> str:
        """The configuration as a point key writes it: '816', 'maxn', or '816/cpu1190.4/emc2133' with CPU or EMC set."""
        extra = "".join(f"/{name}{value:g}" for name, value in (("cpu", self.cpu_mhz), ("emc", self.emc_mhz)) if value is not None)
        return freq_label(self.freq) + extra

    @property
    def key(self) -> str:
        return f"{self.workload}@{self.clocks}#{self.repeat}"

    @property
    def setting(self) -> Setting | None:
        """The configuration as a `Setting` (None at maxn, which pins nothing)."""
        return None if self.freq == MAXN else Setting(float(self.freq), self.cpu_mhz, self.emc_mhz)

    def params(self) -> dict[str, str]:
        """The CPU and memory clocks a run records beside `freq_mhz` (`cpu_freq_mhz`, `emc_freq_mhz`), where set."""
        return {f"{name}_freq_mhz": f"{value:g}" for name, value in (("cpu", self.cpu_mhz), ("emc", self.emc_mhz)) if value is not None}


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    models: tuple[str, ...]
    tasks: tuple[str, ...]
    freqs: tuple[FreqRequest, ...]
    steps: int
    profile_steps: int
    batch_size: int
    repeats: int
    seed: int
    data_source: str
    data_dir: str | None
    train_size: int
    dev_size: int
    experiment: str
    train_once: bool  # the twin: each workload trains once and its steps are charged again at every other clock
    device_profile: str
    sweep_id: str = ""
    shuffle_clocks: bool = False  # on hardware: a seeded random clock order per workload and repeat
    twin_digest: str = ""  # a twin profile that is not built in: a digest of its constants (a refit is another sweep)
    strategy: str = "grid"  # grid: every clock; adaptive: the clocks the curve model asks for (sweep/adaptive.py)
    # Where each non-preset model's config comes from (a path on this machine, a hub id): not the sweep's identity,
    # which the model's name carries (zoo.ModelEntry), so boards holding the same config elsewhere share the sweep.
    model_entries: tuple[ModelEntry, ...] = ()
    precision: str = "fp32"  # fp32 | bf16 | fp16: how every point trains (and what the twin charges)
    peft: PeftSpec = FULL  # full fine-tuning or LoRA, for every point
    warmup_steps: int = 0  # each point's first steps, metered apart (FinetuneConfig.warmup_steps)
    knobs: tuple[tuple[str, Any], ...] = ()  # the job's settings set by name (mlops.fields.KNOBS), sorted
    # The clocks tuned (`--knobs`): ("gpu",), or with "cpu" and/or "emc"; a tuned clock's table (the device's, or
    # --cpu-freqs/--emc-freqs), () for a clock not tuned, which every point leaves alone.
    tuned: tuple[str, ...] = ("gpu",)
    cpu_freqs: tuple[float, ...] = ()
    emc_freqs: tuple[float, ...] = ()

    @property
    def joint(self) -> bool:
        """The sweep tunes a clock besides the GPU's."""
        return self.tuned != ("gpu",)
    # issue 42/43: the board's power mode (Board.power_mode_key: '' in MAXN or without a mode), and a replayed grid's
    # SHA-256 (its workloads are `models`, with the one task REPLAYED_TASK: '')
    power_mode: str = ""
    trace_sha256: str = ""

    @property
    def replay(self) -> bool:
        """`train_once` under the name the identity has always written it (`IDENTITY_FIELDS`), so sweep ids stay."""
        return self.train_once

    @property
    def replayed(self) -> bool:
        """The sweep plays a measured grid (`--device replay`): its points look their measurements up."""
        return bool(self.trace_sha256)

    @property
    def variant(self) -> str:
        """The workloads' name suffix (adapters.variant_suffix): a LoRA or 16-bit point is never a full fp32 one."""
        return variant_suffix(self.peft, self.precision)

    @property
    def trace_dtype(self) -> str:
        """The torch dtype's name the twin traces the points' steps in (as FinetuneConfig.trace_dtype)."""
        from dvfs_mlops.job.finetune import PRECISIONS

        return PRECISIONS[self.precision]

    def entry(self, model: str) -> ModelEntry:
        """The model's `ModelEntry` (a preset's when the list has none for it)."""
        return next((e for e in self.model_entries if e.name == model), ModelEntry(model))

    def points(self) -> list[Point]:
        out = []
        for m in self.models:
            for t in self.tasks:
                for r in range(self.repeats):
                    freqs = list(self.freqs)
                    if self.shuffle_clocks:
                        random.Random(f"{self.seed}|{m}/{t}|{r}").shuffle(freqs)
                    out += [p for f in freqs for p in self.configurations(m, t, f, r)]
        return out

    def configurations(self, model: str, task: str, freq: FreqRequest, repeat: int) -> list[Point]:
        """The points of one GPU clock: with every tuned CPU and EMC clock (maxn alone: it pins nothing)."""
        if freq == MAXN or not self.joint:
            return [Point(model, task, freq, repeat, self.variant)]
        return [Point(model, task, freq, repeat, self.variant, c, e) for c in (self.cpu_freqs or (None,)) for e in (self.emc_freqs or (None,))]

    def definition(self) -> dict[str, Any]:
        """The sweep's identity: the fields of `IDENTITY_FIELDS`, each as JSON (what the sweep id hashes, and the
        parent run's `sweep_definition` param). A field that joined the identity later is left out while it keeps
        its first value (`_FIRST_VALUES`), so sweeps defined before it keep their ids."""
        out: dict[str, Any] = {}
        for name in IDENTITY_FIELDS:
            value = getattr(self, name)
            if name in _FIRST_VALUES and _FIRST_VALUES[name](value):
                continue
            out[name] = _identity_value(name, value)
        return out

    def with_default_id(self) -> SweepSpec:
        """This spec with its id: the given `--sweep-id`, else `sweep_id_of(self.definition())`."""
        return self if self.sweep_id else dataclasses.replace(self, sweep_id=sweep_id_of(self.definition()))


# A sweep's identity, by inclusion: only these fields make a sweep another sweep (schema IDENTITY_SCHEMA). Not in it:
# sweep_id and experiment (where it is stored), shuffle_clocks (the order of the points, not what is measured),
# model_entries (where configs live on this machine: their content is in the models' names). A new field of
# SweepSpec changes no id until it is added here, with a first value in _FIRST_VALUES under which it stays out.
IDENTITY_SCHEMA = 1
IDENTITY_FIELDS = ("models", "tasks", "freqs", "steps", "profile_steps", "batch_size", "repeats", "seed", "data_source", "data_dir",
                   "train_size", "dev_size", "replay", "device_profile", "twin_digest", "strategy", "precision", "peft",
                   "warmup_steps", "knobs", "tuned", "cpu_freqs", "emc_freqs", "power_mode", "trace_sha256")
# Fields that joined the identity after the first sweeps, and the value under which they stay out of it.
_FIRST_VALUES: dict[str, Any] = {
    "twin_digest": lambda v: v == "",  # a built-in twin profile
    "strategy": lambda v: v == "grid",
    "precision": lambda v: v == "fp32",
    "peft": lambda v: not v.is_lora,  # full fine-tuning
    "warmup_steps": lambda v: v == 0,  # every step in the training window (the twin's default)
    "knobs": lambda v: not v,  # every knob at its FinetuneConfig default
    "tuned": lambda v: tuple(v) == ("gpu",),  # the GPU clock alone (the study)
    "cpu_freqs": lambda v: not v,  # the CPU clock not tuned
    "emc_freqs": lambda v: not v,  # the memory clock not tuned
    # issue 42/43: MAXN (or no power mode) keeps today's ids; a sweep that is no replay has no trace
    "power_mode": lambda v: v == "",
    "trace_sha256": lambda v: v == "",
}


def _identity_value(name: str, value: Any) -> Any:
    """A field's value as the identity writes it."""
    if name == "freqs":
        return [freq_label(f) for f in value]
    if name == "peft":
        return dataclasses.asdict(value)
    if name == "knobs":
        return dict(value)
    if name in ("cpu_freqs", "emc_freqs"):
        return [f"{f:g}" for f in value]
    return list(value) if isinstance(value, tuple) else value


def sweep_id_of(definition: dict[str, Any]) -> str:
    """`sweep-` and the first 10 hex digits of the SHA-256 of the definition as sorted, compact-free JSON. Schema 1
    hashes the definition alone; a later schema would add its number to what is hashed."""
    return "sweep-" + hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()[:10]


def _split_list(value: str | Sequence[str] | None) -> list[str] | None:
    if value is None or value == "":
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    return [s.strip() for s in items if s.strip()]


def check_request(request: SweepRequest) -> None:
    """The names a sweep is given (preset, models, tasks, strategy, precision), checked from the command line alone:
    no store, device, config build or network, so a misspelt name is refused at once. `build_spec` checks the rest.

    Raises:
        UnknownNameError: a name that does not exist; the message lists the valid ones.
    """
    if request.preset not in PRESETS:
        raise unknown("preset", request.preset, list(PRESETS))
    if request.strategy not in STRATEGIES:
        raise unknown("strategy", request.strategy, list(STRATEGIES))
    from dvfs_mlops.job.finetune import PRECISIONS

    if request.precision not in PRECISIONS:
        raise unknown("precision", request.precision, list(PRECISIONS))
    for text in _split_list(request.models) or []:
        model_entry(text)
    for t in _split_list(request.tasks) or []:
        get_task(t)
    parse_knobs(request.knobs)
    tuned = parse_tuned(request.tuned)
    for knob, (_, option_) in _KNOB_TABLES.items():
        if _split_list(getattr(request, f"{knob}_freqs")) and knob not in tuned:
            raise DvfsError(f"{option_} names {knob.upper()} clocks for a sweep that does not tune the {knob.upper()} clock; "
                            f"add {knob} to --knobs (e.g. --knobs {','.join([*tuned, knob])}) or drop {option_}")


def parse_tuned(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """`--knobs`: the clocks a sweep tunes, 'gpu' (default), 'gpu,cpu', 'gpu,emc' or 'gpu,cpu,emc', in that order.

    Raises:
        UnknownNameError: a name that is no clock (the message lists them).
        DvfsError: the GPU clock not among them.
    """
    names = _split_list(text) or ["gpu"]
    for name in names:
        if name not in CLOCK_KNOBS:
            raise unknown("clock knob (--knobs)", name, list(CLOCK_KNOBS))
    if "gpu" not in names:
        raise DvfsError(f"--knobs {','.join(names)}: the GPU clock is always tuned, with the CPU's and the memory's where "
                        f"asked; give --knobs gpu,{','.join(names)}")
    return tuple(k for k in CLOCK_KNOBS if k in names)


@dataclasses.dataclass(frozen=True)
class SweepRequest:
    """What a user asked of a sweep: a preset and the overrides of it (None or '': the preset's value)."""

    preset: str = "quick"
    models: str | Sequence[str] | None = None
    tasks: str | Sequence[str] | None = None
    freqs: str | Sequence[str] | None = None
    steps: int | None = None
    profile_steps: int | None = None
    batch_size: int = 16
    repeats: int | None = None
    seed: int = 0
    data_source: str = "synthetic"
    data_dir: str | None = None
    experiment: str = SWEEP_EXPERIMENT
    train_once: bool = True
    sweep_id: str | None = None
    train_size: int | None = None
    dev_size: int | None = None
    strategy: str = "grid"
    precision: str = "fp32"
    peft: PeftSpec = FULL
    warmup_steps: int | None = None  # None: 3 on hardware, 0 on the twin (job.run.warmup_for)
    knobs: Sequence[str] = ()  # NAME=VALUE settings of the job (mlops.fields.KNOBS)
    tuned: str | Sequence[str] = "gpu"  # --knobs: the clocks tuned (gpu, gpu,cpu, gpu,cpu,emc)
    cpu_freqs: str | Sequence[str] | None = None  # the CPU clocks of a sweep tuning cpu (None: the device's table)
    emc_freqs: str | Sequence[str] | None = None  # the memory clocks of a sweep tuning emc (None: the device's table)
    workloads: str | Sequence[str] | None = None  # issue 43: a replayed grid's workloads by name (None: every one)


def build_spec(board: Board, request: SweepRequest, device: Device | None = None, grid: ReplayGrid | None = None) -> SweepSpec:
    """The validated definition of a sweep on `board`: the preset with the request's overrides (on a replayed grid, the
    grid's workloads: `replay_spec`).

    Args:
        board: the board the sweep runs on (its clock table, profile and whether it is the twin).
        request: the preset and its overrides.
        device: the open device (its CPU and memory clock tables, for a sweep that tunes them).
        grid: the measured grid a replay device plays (None: any other device).

    Returns:
        The `SweepSpec`, with its id (the request's, else the hash of its identity).

    Raises:
        DvfsError: an unknown name, a clock not in the table, a model that cannot train a task, LoRA targets that
            match nothing, a data folder without a task's files, profile-only steps on real hardware, or a clock to
            tune that the device cannot set.
    """
    r = request
    check_request(r)
    if grid is not None:
        return replay_spec(board, r, grid, device)
    if _split_list(r.workloads):
        raise DvfsError("--workloads picks the workloads of a replayed grid (--device replay --trace FILE); on this device "
                        "name them with --models and --tasks")
    p = PRESETS[r.preset]
    entries = _model_entries(_split_list(r.models) or list(p.models))
    task_list = _split_list(r.tasks) or list(p.tasks)
    task_specs = [get_task(t) for t in task_list]
    _check_models_fit_tasks(entries, task_specs)
    if r.peft.is_lora:
        _check_lora_targets(entries, task_specs, r.peft)
    n_steps = p.steps if r.steps is None else r.steps
    if n_steps < 0:
        raise DvfsError(f"--steps must be >= 0, got {n_steps}")
    if n_steps == 0 and not board.simulated:
        raise DvfsError("--steps 0 (profile only) exists only on the sim device: real hardware has to train to be measured")
    data_source = r.data_source
    if r.data_dir is not None:
        data_source = "tsv"
        _check_data_dir(Path(r.data_dir), task_specs)
    spec = SweepSpec(
        models=tuple(e.name for e in entries), tasks=tuple(task_list), freqs=_clocks(r.freqs, p, board), steps=n_steps,
        profile_steps=p.profile_steps if r.profile_steps is None else r.profile_steps, batch_size=r.batch_size,
        repeats=p.repeats if r.repeats is None else r.repeats, seed=r.seed, data_source=data_source, data_dir=r.data_dir,
        train_size=p.train_size if r.train_size is None else r.train_size, dev_size=p.dev_size if r.dev_size is None else r.dev_size,
        experiment=r.experiment, train_once=r.train_once and board.simulated, device_profile=board.profile, sweep_id=r.sweep_id or "",
        shuffle_clocks=not board.simulated, twin_digest=board.twin_digest, strategy=r.strategy,
        model_entries=tuple(e for e in entries if e.config_path or e.pretrained), precision=r.precision, peft=r.peft,
        warmup_steps=warmup_for(r.warmup_steps, board.simulated, n_steps),  # what runs: at most a quarter of the steps
        knobs=tuple(sorted(parse_knobs(r.knobs).items())), power_mode=board.power_mode_key,
        tuned=parse_tuned(r.tuned), **_knob_clocks(r, device),
    )
    return spec.with_default_id()


# issue 43: a replayed sweep. Its points are the grid's workloads at the table's clocks; each point looks one unit of
# work up (the grid's time_s and energy_j are that unit's), so training options do not apply.
REPLAY_STEPS = 1
REPLAY_DATA_SOURCE = "replay"


def replay_spec(board: Board, request: SweepRequest, grid: ReplayGrid, device: Device | None = None) -> SweepSpec:
    """The definition of a sweep of a measured grid: `--workloads` (default: every workload of the file, in its order)
    at `--freqs` (default: the whole table; presets do not apply), each point one looked-up unit of work.

    Args:
        board: the replay device's board (the file's clock table).
        request: the request; models, tasks, steps and the training options do not apply.
        grid: the grid the device plays.
        device: the replay device (its CPU and memory clock tables, for a sweep that tunes them).

    Returns:
        The `SweepSpec`; its identity has the grid's SHA-256 (another file, or the same file edited, is another sweep).

    Raises:
        DvfsError: --models or --tasks (a grid names its workloads), a workload not in the file, or a clock not in it.
    """
    r = request
    if _split_list(r.models) or _split_list(r.tasks):
        raise DvfsError(f"a replayed grid names its own workloads ({', '.join(grid.workloads[:6])}); pick them with --workloads, "
                        "not --models/--tasks")
    if r.steps not in (None, REPLAY_STEPS) or r.profile_steps is not None:
        raise DvfsError("a replayed point looks one measured unit of work up, so --steps and --profile-steps do not apply; "
                        "drop them")
    names = list(dict.fromkeys(_split_list(r.workloads) or grid.workloads))
    for name in names:
        grid.check_workload(name)
    spec = SweepSpec(
        models=tuple(names), tasks=("",), freqs=_clocks(r.freqs, SweepPreset((), (), None, REPLAY_STEPS), board), steps=REPLAY_STEPS, profile_steps=0,
        batch_size=r.batch_size, repeats=1 if r.repeats is None else r.repeats, seed=r.seed, data_source=REPLAY_DATA_SOURCE,
        data_dir=None, train_size=0, dev_size=0, experiment=r.experiment, train_once=False, device_profile=board.profile,
        sweep_id=r.sweep_id or "", strategy=r.strategy, trace_sha256=grid.sha256,
        tuned=parse_tuned(r.tuned), **_knob_clocks(r, device),
    )
    return spec.with_default_id()


def _knob_clocks(request: SweepRequest, device: Device | None) -> dict[str, Any]:
    """The CPU and memory clocks of a sweep that tunes them: those asked for, else the device's whole table.

    Raises:
        DvfsError: a tuned clock the device cannot set (no table), or a clock not in its table.
    """
    tuned = parse_tuned(request.tuned)
    out: dict[str, tuple[float, ...]] = {}
    for knob, (key, _option) in _KNOB_TABLES.items():
        if knob not in tuned:
            continue
        table = sorted(knob_table(device, key)) if device is not None else []
        if not table:
            backend = getattr(device, "name", "this")
            raise DvfsError(f"--knobs {','.join(tuned)}: the {backend} backend cannot set the {knob.upper()} clock; drop {knob} from "
                            "--knobs, or sweep a device that sets it (jetson; replay with a grid that has the column)")
        names = _split_list(getattr(request, f"{knob}_freqs"))
        out[f"{knob}_freqs"] = tuple(sorted({parse_knob(f, table, key) for f in names})) if names else tuple(float(f) for f in table)
    return out


def _clocks(freqs: str | Sequence[str] | None, preset: SweepPreset, board: Board) -> tuple[FreqRequest, ...]:
    """The sweep's clocks: maxn (the baseline, always) and the requested ones, else the preset's, else the table."""
    names = _split_list(freqs) or (list(preset.freqs) if preset.freqs else None)
    table = list(board.frequencies_mhz)
    if names is None:
        return (MAXN, *table)
    parsed = [parse_freq(f, table) for f in names]
    chosen = ([MAXN] if MAXN not in parsed else []) + parsed
    return tuple(sorted(set(chosen), key=lambda f: -1.0 if f == MAXN else float(f)))


def _check_data_dir(data_dir: Path, tasks: list[Any]) -> None:
    """Every task has its files under `data_dir` (GLUE TSV, or instruct's JSONL), before anything runs."""
    from dvfs_mlops.job.workloads.glue_tsv import check_task_dir
    from dvfs_mlops.job.workloads.instruct import find_files

    for t in tasks:
        if t.causal_lm:
            find_files(data_dir, t.name)
        else:
            check_task_dir(data_dir, t)


def _model_entries(texts: list[str]) -> list[ModelEntry]:
    """Presets, config files or folders and hub names -> entries, each checked before anything runs: a config is
    built (an unknown model_type fails here, not at its first point) and a hub model's config is fetched."""
    entries: list[ModelEntry] = []
    for text in texts:
        e = model_entry(text)
        if e.name not in {x.name for x in entries}:  # the same config twice (two paths, one content) is one model
            entries.append(e)
    from dvfs_mlops.job.workloads.zoo import check_scratch_vocab, resolve_model

    for e in entries:
        if e.config_path or e.pretrained:
            spec = resolve_model(e.name, e.config_path, e.pretrained)
            check_scratch_vocab(spec)
            _ = spec.config
    return entries


def _check_models_fit_tasks(entries: list[ModelEntry], tasks: list[Any]) -> None:
    """A causal-LM task needs a decoder with a causal-LM class: every (model, task) pair is checked before the first
    point (an encoder is refused from its config's data; a config's class is asked of transformers, as it is built)."""
    lm_tasks = [t for t in tasks if t.causal_lm]
    if not lm_tasks:
        return
    from dvfs_mlops.job.workloads.zoo import check_task_model, resolve_model

    for e in entries:
        spec = resolve_model(e.name, e.config_path, e.pretrained)
        for t in lm_tasks:
            check_task_model(spec, t.name, t.kind)
        if e.config_path or e.pretrained:  # presets are known to have one (pythia: GPTNeoXForCausalLM)
            from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

            from dvfs_mlops.job.workloads.features import no_causal_lm_error

            if type(spec.config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
                raise no_causal_lm_error(spec.config, ValueError(f"no causal LM for {type(spec.config).__name__}"))


def _check_lora_targets(entries: list[ModelEntry], tasks: list[Any], peft: PeftSpec) -> None:
    """Every model takes the LoRA targets (an architecture without defaults, or a name that matches nothing, fails
    here, not at its first point). The count is cached per config, so the sweep's own features reuse it."""
    from dvfs_mlops.job.workloads.features import model_facts
    from dvfs_mlops.job.workloads.zoo import resolve_model

    kinds = sorted({t.kind for t in tasks})  # a classifier's and a causal LM's heads are adapted differently
    for e in entries:
        for kind in kinds:
            model_facts(resolve_model(e.name, e.config_path, e.pretrained), 2, task_kind=kind, peft=peft)
