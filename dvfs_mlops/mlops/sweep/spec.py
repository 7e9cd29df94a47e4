"""Sweep presets and the validated definition of a sweep (`SweepSpec`, its points and its id)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dvfs_mlops.clocks import MAXN, FreqRequest, freq_label
from dvfs_mlops.errors import DvfsError, unknown
from dvfs_mlops.hw.device import parse_freq
from dvfs_mlops.job.workloads.adapters import FULL, PeftSpec, variant_suffix
from dvfs_mlops.job.workloads.tasks import TASKS, get_task
from dvfs_mlops.job.workloads.zoo import PRESETS as MODEL_PRESETS
from dvfs_mlops.job.workloads.zoo import ModelEntry, model_entry


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
    # 2 tiny models x 3 tasks (2 train, 1 eval) x 3 clocks + maxn, a few steps: under a minute on a CPU.
    "smoke": SweepPreset(("bert-tiny", "pythia-14m"), ("sst2", "mrpc", "rte"), ("510", "816", "1300.5"), steps=4, train_size=128, dev_size=64),
    # The smallest BERT and Pythia on sst2, mrpc, rte at every clock + maxn: minutes on 2 cores.
    "quick": SweepPreset(("bert-tiny", "pythia-14m"), ("sst2", "mrpc", "rte"), None, steps=60),
    # The study: 12 models x 9 tasks. On the twin, steps=0 profiles without training.
    "paper": SweepPreset(tuple(MODEL_PRESETS), tuple(TASKS), None, steps=0, profile_steps=200),
}


STRATEGIES = ("grid", "adaptive")


@dataclasses.dataclass(frozen=True)
class Point:
    model: str
    task: str
    freq: FreqRequest
    repeat: int
    variant: str = ""  # "+lora-r8a16+bf16": how the model is adapted and in which precision ('' = full, fp32)

    @property
    def workload(self) -> str:
        return f"{self.model}/{self.task}{self.variant}"

    @property
    def key(self) -> str:
        return f"{self.workload}@{freq_label(self.freq)}#{self.repeat}"


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
    replay: bool
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
                    out += [Point(m, t, f, r, self.variant) for f in freqs]
        return out

    def definition(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("sweep_id")
        d.pop("experiment")
        d.pop("shuffle_clocks")  # the order of the points, not what is measured
        d.pop("model_entries")  # where configs live on this machine; their content is in the models' names
        if self.precision == "fp32":
            d.pop("precision")  # fp32 sweeps keep the ids they had before precisions existed
        if not self.peft.is_lora:
            d.pop("peft")  # so do full fine-tuning sweeps, before adapters existed
        if not self.twin_digest:  # absent unless set, so the ids of sweeps on built-in profiles stay what they were
            d.pop("twin_digest")
        if d.get("strategy") == "grid":
            d.pop("strategy")  # grid sweeps keep the ids they had before strategies existed
        d["freqs"] = [freq_label(f) for f in self.freqs]
        return d

    def with_default_id(self) -> SweepSpec:
        if self.sweep_id:
            return self
        digest = hashlib.sha256(json.dumps(self.definition(), sort_keys=True).encode()).hexdigest()[:10]
        return dataclasses.replace(self, sweep_id=f"sweep-{digest}")


def _split_list(value: str | Sequence[str] | None) -> list[str] | None:
    if value is None or value == "":
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    return [s.strip() for s in items if s.strip()]


def check_names(preset: str = "quick", *, models: Any = None, tasks: Any = None, strategy: str = "grid",
                precision: str = "fp32") -> None:
    """The names a sweep is given (preset, models, tasks, strategy, precision), checked from the command line alone:
    no store, device, config build or network, so a misspelt name is refused at once. `build_spec` checks the rest."""
    if preset not in PRESETS:
        raise unknown("preset", preset, list(PRESETS))
    if strategy not in STRATEGIES:
        raise unknown("strategy", strategy, list(STRATEGIES))
    from dvfs_mlops.job.finetune import PRECISIONS

    if precision not in PRECISIONS:
        raise unknown("precision", precision, list(PRECISIONS))
    for text in _split_list(models) or []:
        model_entry(text)
    for t in _split_list(tasks) or []:
        get_task(t)


def build_spec(device: Any, preset: str = "quick", *, models: Any = None, tasks: Any = None, freqs: Any = None,
               steps: int | None = None, profile_steps: int | None = None, batch_size: int = 16, repeats: int | None = None,
               seed: int = 0, data_source: str = "synthetic", data_dir: str | None = None, experiment: str = "dvfs-sweep",
               replay: bool = True, sweep_id: str | None = None, train_size: int | None = None, dev_size: int | None = None,
               strategy: str = "grid", precision: str = "fp32", peft: PeftSpec = FULL) -> SweepSpec:
    """Preset + overrides -> a validated SweepSpec (every name checked before anything runs)."""
    check_names(preset, strategy=strategy, precision=precision)
    p = PRESETS[preset]
    entries = _model_entries(_split_list(models) or list(p.models))
    model_list = [e.name for e in entries]
    task_list = _split_list(tasks) or list(p.tasks)
    task_specs = [get_task(t) for t in task_list]
    _check_models_fit_tasks(entries, task_specs)
    if peft.is_lora:
        _check_lora_targets(entries, task_specs, peft)
    freq_names = _split_list(freqs) or (list(p.freqs) if p.freqs else None)
    table = device.frequencies_mhz
    if freq_names is None:
        freq_list: list[FreqRequest] = [MAXN, *table]
    else:
        parsed = [parse_freq(f, table) for f in freq_names]
        freq_list = ([MAXN] if MAXN not in parsed else []) + parsed  # maxn always: the baseline
        freq_list = sorted(set(freq_list), key=lambda f: -1.0 if f == MAXN else float(f))
    n_steps = p.steps if steps is None else steps
    if n_steps < 0:
        raise DvfsError(f"--steps must be >= 0, got {n_steps}")
    if n_steps == 0 and not device.simulated:
        raise DvfsError("--steps 0 (profile only) exists only on the sim device: real hardware has to train to be measured")
    if data_dir is not None:
        data_source = "tsv"
        from dvfs_mlops.job.workloads.glue_tsv import check_task_dir
        from dvfs_mlops.job.workloads.instruct import find_files

        for t in task_specs:
            if t.causal_lm:
                find_files(Path(data_dir), t.name)
            else:
                check_task_dir(Path(data_dir), t)
    spec = SweepSpec(
        models=tuple(model_list), tasks=tuple(task_list), freqs=tuple(freq_list), steps=n_steps,
        profile_steps=p.profile_steps if profile_steps is None else profile_steps, batch_size=batch_size,
        repeats=p.repeats if repeats is None else repeats, seed=seed, data_source=data_source, data_dir=data_dir,
        train_size=p.train_size if train_size is None else train_size, dev_size=p.dev_size if dev_size is None else dev_size,
        experiment=experiment, replay=replay and device.simulated, device_profile=device.profile, sweep_id=sweep_id or "",
        shuffle_clocks=not device.simulated, twin_digest=_twin_digest(device), strategy=strategy,
        model_entries=tuple(e for e in entries if e.config_path or e.pretrained), precision=precision, peft=peft,
    )
    return spec.with_default_id()


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


def _twin_digest(device: Any) -> str:
    """The twin's constants when its profile is not a built-in one (a YAML board, a fitted profile), else ''."""
    from dvfs_mlops.hw.twin.profiles import BUILTIN_PROFILES, params_digest

    params = getattr(device, "params", None)
    if not device.simulated or params is None or BUILTIN_PROFILES.get(device.profile) == params:
        return ""
    return params_digest(params)
