"""Every param and metric a metered job's run logs, declared once: name, type, unit and a one-line meaning.

The workload's features are the fields of `model.workload.WorkloadFeatures` (each declared there with its unit and
meaning); everything else a point run, a fine-tune run and `DvfsCallback` log is declared here. What derives from the
declarations: the writer (`records`: its names, and the report metrics read off `EnergyReport` by `REPORT_METRICS`),
the reader (`dataset`: each column by `column(name)`, each value typed by `Field.parse`, a whole run by
`dataset.run_record`), the pyfunc's input signature (`pyfunc.signature`, from the features) and the docs' table of
logged fields (`markdown_table`). A name written or read that is not declared here is an error (`field`).
Tags are named in `schema.py`.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from dvfs_mlops.model.workload import METRIC, PARAM, WorkloadFeatures, feature_types

POINT, FINETUNE, CALLBACK = "point", "finetune", "callback"  # which runs log a field (a fine-tune also logs a point's)


@dataclasses.dataclass(frozen=True)
class Field:
    """One logged param or metric.

    Attributes:
        name: its MLflow name; `{metric}` / `{host}` / `{uuid}` stand for a family of names (`<metric>/<host>/<uuid>`).
        kind: `param` or `metric`.
        type: str, int, float or bool (MLflow keeps params as text and metrics as floats: `parse` gives it back typed).
        unit: its unit ('' for a count, a name or a flag).
        meaning: one line.
        runs: which runs log it: point (a sweep point, and every fine-tune run), finetune, callback.
        feature: it is one of the governor's input columns (`WorkloadFeatures`).
        report: the `EnergyReport` attribute a report metric is read from ('' for any other field).
        knob: a setting of the job (`KNOBS`): the `job.finetune.FinetuneConfig` field of that name, set with
            `--knob NAME=VALUE` on sweep and finetune, recorded on every run, part of a sweep's identity once set.
    """

    name: str
    kind: str
    type: type
    unit: str
    meaning: str
    runs: str = POINT
    feature: bool = False
    report: str = ""
    knob: bool = False

    @property
    def column(self) -> str:
        """Its column in `mlflow.search_runs`' frame: `params.<name>` or `metrics.<name>`."""
        return f"{self.kind}s.{self.name}"

    def parse(self, value: str | float | None) -> Any:
        """A logged value back as its type; None where the run has none (absent, NaN, empty)."""
        if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
            return None
        if self.type is bool:
            return str(value).lower() in ("true", "1", "1.0")
        if self.type is int:
            return int(float(value))
        return self.type(value)


def _param(name: str, type_: type, unit: str, meaning: str, runs: str = POINT) -> Field:
    return Field(name, PARAM, type_, unit, meaning, runs)


def _metric(name: str, unit: str, meaning: str, runs: str = POINT, report: str = "", type_: type = float) -> Field:
    return Field(name, METRIC, type_, unit, meaning, runs, report=report)


def _knob(name: str, type_: type, unit: str, meaning: str) -> Field:
    return Field(name, PARAM, type_, unit, meaning, knob=True)


# The job's settings a command line sets by name (`--knob NAME=VALUE`): each the `FinetuneConfig` field of its name,
# with its default there. One declaration here and the field there is all a new knob takes.
KNOBS: tuple[Field, ...] = (
    _knob("attn_implementation", str, "", "the attention kernel real training runs (sdpa, eager); the twin traces eager"),
)


def _feature_fields() -> tuple[Field, ...]:
    """The features a run records as params (`WorkloadFeatures` fields recorded `PARAM`); gpu_util_pct, recorded as a
    metric, is the report metric of that name."""
    types = feature_types()
    return tuple(Field(f.name, PARAM, types[f.name], f.metadata["unit"], f.metadata["meaning"], feature=True)
                 for f in dataclasses.fields(WorkloadFeatures) if f.metadata["recorded"] == PARAM)


# The training window's report (`EnergyReport`): what energy_j and time_s mean on every backend.
REPORT_METRICS: tuple[Field, ...] = (
    _metric("energy_j", "J", "CPU + GPU energy of the training steps after warm-up (the rails of energy_rails)", report="energy_j"),
    _metric("energy_gpu_j", "J", "the GPU rails' share of energy_j (None where CPU and GPU share a rail)", report="energy_gpu_j"),
    _metric("energy_cpu_j", "J", "the CPU rails' share of energy_j", report="energy_cpu_j"),
    _metric("energy_total_j", "J", "the module input (VDD_IN) over the same steps, else every rail", report="energy_total_j"),
    _metric("avg_power_w", "W", "energy_total_j / time_s", report="avg_power_w"),
    _metric("peak_power_w", "W", "the highest sampled total power", report="peak_power_w"),
    _metric("time_s", "s", "the training steps' time after warm-up", report="duration_s"),
    _metric("gpu_util_pct", "%", "mean GPU load over the steps (a workload's feature is its maxn points' mean)",
            report="gpu_util_pct"),
    _metric("clock_mhz_measured", "MHz", "time-weighted mean GPU clock read back", report="clock_mhz_measured"),
    _metric("clock_held", "", "1: the clock read back stayed at the pin >= 95 % of the time (absent: nothing pinned)",
            report="clock_held", type_=bool),
    _metric("samples_failed", "", "power samples that could not be read", report="samples_failed", type_=int),
    _metric("emc_mhz", "MHz", "mean memory (EMC) clock (Jetson)", report="emc_mhz"),
    _metric("oc_throttle_events", "", "over-current throttling events the board counted (Jetson)", report="oc_throttle_events",
            type_=int),
    _metric("energy_expected_j", "J", "the twin only: energy_j without its run-to-run noise (SIMULATED)", report="energy_expected_j"),
    _metric("time_expected_s", "s", "the twin only: time_s without its run-to-run noise (SIMULATED)", report="time_expected_s"),
)

_JOB_PARAMS: tuple[Field, ...] = (
    _param("model", str, "", "the model preset or name"),
    _param("task", str, "", "the task (a GLUE task or instruct)"),
    _param("freq_mhz", str, "MHz", "the clock pinned (after refine: the settled one), or maxn"),
    _param("device", str, "", "the backend: jetson, nvml or sim"),
    _param("device_profile", str, "", "the board's profile (a twin profile, the Jetson module, the GPU)"),
    _param("batch_size", int, "", "examples per training step"),
    _param("steps", int, "", "training steps (0: a profile-only point of the twin)"),
    _param("profile_steps", int, "", "a profile-only point: the steps charged"),
    _param("seed", int, "", "data, model init and sampling"),
    _param("split", str, "", "train or eval: the workload's side of the governor's held-out split"),
    _param("data_source", str, "", "synthetic, tsv or hub"),
    _param("torch_device", str, "", "where training ran (cpu, cuda:0 ...)"),
    _param("peft", str, "", "full or lora"),
    _param("lora_r", int, "", "LoRA rank"),
    _param("lora_alpha", int, "", "LoRA scale alpha"),
    _param("lora_targets", str, "", "the modules LoRA adapts (default: peft's table)"),
    _param("lora_dropout", float, "", "LoRA dropout"),
    _param("repeat", int, "", "a sweep point's repeat"),
    _param("model_config", str, "", "a sweep point of a config file: its path"),
    _param("pretrained", str, "", "a sweep point of real weights: where from"),
    _param("device_index", int, "", "on hardware: the GPU's index (NVML's; 0 on a Jetson)"),
    _param("energy_rails", str, "", "the rails summed into energy_j"),
    _param("clock_source", str, "", "where clock_mhz_measured comes from: measured or requested"),
    _param("nvpmodel_mode", str, "", "Jetson: the power mode the job ran under"),
    _param("power_source", str, "", "nvml: where the power samples come from"),
    _param("mig_mode", str, "", "nvml: the GPU's MIG mode"),
    _param("energy_scope", str, "", "nvml: what the energy covers (the whole GPU under MIG)"),
    _param("gpu_util_probe_pct", float, "%", "the utilisation the launcher measured at maxn (or the twin's)", FINETUNE),
)

_JOB_METRICS: tuple[Field, ...] = (
    _metric("eval_accuracy", "", "dev-split accuracy (classification)"),
    _metric("eval_pearson", "", "dev-split Pearson correlation (regression: stsb)"),
    _metric("eval_token_accuracy", "", "next-token accuracy on the response tokens (instruct)"),
    _metric("eval_loss", "", "mean cross-entropy of the response tokens (instruct)"),
    _metric("samples_per_s", "1/s", "training examples after warm-up per second of time_s"),
    _metric("energy_per_sample_j", "J", "energy_j per training example after warm-up"),
    _metric("wall_time_s", "s", "the training loop's wall time"),
    _metric("clock_mhz", "MHz", "the clock the job ran at (the twin's own under maxn; absent when observing)"),
    _metric("eval_energy_j", "J", "the evaluation's energy"),
    _metric("eval_time_s", "s", "the evaluation's time"),
    _metric("warmup_energy_j", "J", "the warm-up steps' energy, metered apart"),
    _metric("warmup_s", "s", "the warm-up steps' time"),
    _metric("session_energy_j", "J", "the whole session's energy (model build, warm-up, training, evaluation)"),
    _metric("session_time_s", "s", "the whole session's time"),
    _metric("gpu_temp_c", "degC", "the GPU's temperature at the start"),
    _metric("gpu_temp_c_end", "degC", "the GPU's temperature at the end"),
    _metric("gpu_temp_c_max", "degC", "the highest GPU temperature read"),
    _metric("nvpmodel_gpu_max_mhz", "MHz", "Jetson: the power mode's GPU cap"),
    _metric("power_w", "W", "the series of total power samples (one step per sample, at most 1000)"),
    _metric("expected_saving_vs_maxn", "", "the twin's estimate of the decided clock's saving against maxn (SIMULATED)", FINETUNE),
    _metric("refine_probe_steps", "", "training steps refine spent probing", FINETUNE),
)

_CALLBACK_METRICS: tuple[Field, ...] = (
    _metric("dvfs_{metric}", "", "DvfsCallback: a report metric in the user's run (energy_j, energy_total_j, avg_power_w, "
            "peak_power_w, time_s, gpu_util_pct, clock_mhz_measured, clock_held, samples_failed, emc_mhz, oc_throttle_events, "
            "warmup_energy_j, warmup_s)", CALLBACK),
    _metric("{metric}/{host}/{uuid}", "", "a job on several GPUs: each GPU's energy_j, energy_total_j, avg_power_w, "
            "clock_mhz_measured, clock_held, time_s by node and UUID (DvfsCallback: dvfs_-prefixed)", CALLBACK),
)

# issue 42 (real boards, round 3) and issue 39 (the clock service): what a session found at its start and what became
# of its pin, recorded on point and fine-tune runs (`records.session_params`, `records.session_metrics`).
_SESSION_FIELDS: tuple[Field, ...] = (
    _param("energy_source", str, "", "where energy_j comes from: counter (a hardware energy counter) or samples (power "
           "samples integrated)"),
    _metric("energy_counter_period_s", "s", "nvml: the energy counter's update period, inferred at the start"),
    _param("nvpmodel_tpc_pg_mask", int, "", "Jetson: the GPU TPCs the power mode power-gates (a bit per TPC)"),
    _metric("cap_at_start_mhz", "MHz", "the GPU's cap found at the start below the power mode's (or the table's) top: "
            "a thermal, PM QoS or user cap (also tag dvfs.cap_at_start)"),
    _param("clock_limits_at_start", str, "", "nvml: the reasons NVML gave at the start for holding the clock down"),
    _metric("clock_unheld_s", "s", "the time the clock service did not hold the pin (lost, then pinned again); also tag "
            "dvfs.clock_lost"),
)

# Issue 44: a configuration is the GPU clock (freq_mhz) with the CPU and memory clocks of a sweep or job that tunes them.
_CONFIGURATION_PARAMS: tuple[Field, ...] = (
    _param("cpu_freq_mhz", float, "MHz", "the CPU clock pinned with freq_mhz (a sweep or job tuning cpu); absent: left alone"),
    _param("emc_freq_mhz", float, "MHz", "the memory (EMC) clock pinned with freq_mhz (tuning emc); absent: left alone"),
    _param("energy_joint_rails", str, "", "a joint sweep on the twin: the rails energy_joint_j sums (the CPU and memory clocks' too)"),
    _metric("energy_joint_j", "J", "a joint sweep on the twin: the training window's energy on energy_joint_rails, what its "
            "configurations are compared on (SIMULATED)"),
    _metric("energy_joint_expected_j", "J", "energy_joint_j without its run-to-run noise (SIMULATED)"),
)

FEATURES: tuple[Field, ...] = _feature_fields()
FIELDS: tuple[Field, ...] = (FEATURES + KNOBS + _JOB_PARAMS + _CONFIGURATION_PARAMS + REPORT_METRICS + _JOB_METRICS
                             + _CALLBACK_METRICS + _SESSION_FIELDS)
_BY_NAME: dict[tuple[str, str], Field] = {(f.kind, f.name): f for f in FIELDS}


def field(name: str, kind: str = PARAM) -> Field:
    """The declaration of the param (or metric) `name`.

    Raises:
        KeyError: nothing of that name is declared: declare it above (or in `WorkloadFeatures`).
    """
    try:
        return _BY_NAME[(kind, name)]
    except KeyError:
        raise KeyError(f"{kind} {name!r} is not declared in mlops/fields.py") from None


def column(name: str, kind: str = PARAM) -> str:
    """`params.<name>` / `metrics.<name>` of a declared field (`field`)."""
    return field(name, kind).column


def declared(name: str, kind: str) -> bool:
    """`name` is a declared field of `kind`, or one of a declared family (`dvfs_<metric>`, `<metric>/<host>/<uuid>`, and `<metric>_gpu<index>` as runs before it wrote them)."""
    if (kind, name) in _BY_NAME:
        return True
    if kind != METRIC:
        return False
    base = name.removeprefix("dvfs_")
    if "/" in base:  # a GPU's own: <metric>/<host>/<uuid>
        base = base.split("/", 1)[0]
    elif "_gpu" in base:
        base, _, index = base.rpartition("_gpu")
        if not index.isdigit():
            return False
    return (METRIC, base) in _BY_NAME


def parse_knobs(texts: Sequence[str]) -> dict[str, Any]:
    """`NAME=VALUE` settings (each text may hold several, comma-separated; empty ones are ignored) -> {name: value},
    each value typed as its knob is declared.

    Raises:
        DvfsError: a name that is no knob (the message lists them), a text without `=`, or a value of the wrong type.
    """
    from dvfs_mlops.errors import DvfsError, unknown

    knobs = {k.name: k for k in KNOBS}
    out: dict[str, Any] = {}
    for item in (part.strip() for text in texts for part in str(text).split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        if not sep:
            raise DvfsError(f"--knob {item!r}: give NAME=VALUE (knobs: {', '.join(knobs)})")
        if name.strip() not in knobs:
            raise unknown("knob", name.strip(), list(knobs))
        try:
            out[name.strip()] = knobs[name.strip()].parse(value.strip())
        except ValueError:
            raise DvfsError(f"--knob {item!r}: {name.strip()} takes a {knobs[name.strip()].type.__name__}") from None
    return out


def markdown_table() -> str:
    """The docs' table of every logged param and metric: name, kind, type, unit, runs, meaning (markdown)."""
    rows = ["| name | kind | type | unit | runs | meaning |", "|---|---|---|---|---|---|"]
    for f in FIELDS:
        runs = f"{f.runs} (feature)" if f.feature or f.name == "gpu_util_pct" else f"{f.runs} (knob)" if f.knob else f.runs
        rows.append(f"| `{f.name}` | {f.kind} | {f.type.__name__} | {f.unit} | {runs} | {f.meaning} |")
    return "\n".join(rows) + "\n"
