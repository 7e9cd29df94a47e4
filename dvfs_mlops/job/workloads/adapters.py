"""How a model is adapted: full fine-tuning or LoRA (the `peft` library), and the workload's variant name.

A LoRA job and a full one on the same model are different workloads to the governor: frozen weights
get no weight gradient and no optimizer state, so a step does less work per byte moved and its
energy curve differs. `PeftSpec` is the choice as a record (CLI options, sweep definition, run
params); `variant_suffix` names it, with the precision, in the workload's identity
(`pythia-70m/sst2+lora-r8a16+bf16`), so a LoRA run never resumes a full one. The default, full
fine-tuning in fp32, adds no suffix: its workload is named by model and task alone.

`peft` and torch are imported only when a model is actually adapted.
"""
from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from dvfs_mlops.errors import DvfsError, unknown

if TYPE_CHECKING:
    import torch

PEFT_METHODS = ("full", "lora")
DEFAULT_LORA_R = 8
DEFAULT_LORA_ALPHA = 16
DEFAULT_LORA_DROPOUT = 0.05


@dataclasses.dataclass(frozen=True)
class PeftSpec:
    """Full fine-tuning, or LoRA with rank `r`, scale `alpha` and the modules it adapts (`targets`; () = the
    architecture's default, from peft's table)."""

    method: str = "full"
    r: int = DEFAULT_LORA_R
    alpha: int = DEFAULT_LORA_ALPHA
    targets: tuple[str, ...] = ()
    dropout: float = DEFAULT_LORA_DROPOUT

    @property
    def is_lora(self) -> bool:
        return self.method == "lora"

    @property
    def label(self) -> str:
        """'' for full fine-tuning; `lora-r8a16` (plus `-q_proj.v_proj` where the targets are given)."""
        if not self.is_lora:
            return ""
        return f"lora-r{self.r}a{self.alpha}" + (f"-{'.'.join(self.targets)}" if self.targets else "")

    def params(self) -> dict[str, str]:
        """What a run records of it (MLflow params)."""
        if not self.is_lora:
            return {"peft": "full"}
        return {"peft": "lora", "lora_r": str(self.r), "lora_alpha": str(self.alpha),
                "lora_targets": ",".join(self.targets) or "default", "lora_dropout": str(self.dropout)}

    def definition(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def apply(self, model: torch.nn.Module, model_type: str, task_kind: str = "classification") -> torch.nn.Module:
        """The model adapted this way (see `apply_peft`)."""
        return apply_peft(model, self, model_type, task_kind)


FULL = PeftSpec()


def peft_spec(method: str = "full", r: int | None = None, alpha: int | None = None, targets: str | Sequence[str] | None = None,
              dropout: float | None = None) -> PeftSpec:
    """CLI options -> a checked PeftSpec; LoRA options without `--peft lora` are an error, not silently ignored."""
    method = (method or "full").strip().lower()
    if method not in PEFT_METHODS:
        raise unknown("--peft method", method, list(PEFT_METHODS))
    given = [name for name, v in (("--lora-r", r), ("--lora-alpha", alpha), ("--lora-targets", targets or None),
                                  ("--lora-dropout", dropout)) if v is not None]
    if method == "full":
        if given:
            raise DvfsError(f"{', '.join(given)} only apply with --peft lora")
        return FULL
    r = DEFAULT_LORA_R if r is None else int(r)
    alpha = DEFAULT_LORA_ALPHA if alpha is None else int(alpha)
    dropout = DEFAULT_LORA_DROPOUT if dropout is None else float(dropout)
    if r < 1:
        raise DvfsError(f"--lora-r must be >= 1, got {r}")
    if alpha < 1:
        raise DvfsError(f"--lora-alpha must be >= 1, got {alpha}")
    if not 0.0 <= dropout < 1.0:
        raise DvfsError(f"--lora-dropout must be in [0, 1), got {dropout:g}")
    names = targets.split(",") if isinstance(targets, str) else list(targets or [])
    names = [n.strip() for n in names if n.strip()]
    return PeftSpec("lora", r, alpha, tuple(names), dropout)


def peft_from_params(params: dict[str, Any]) -> PeftSpec:
    """A run's params -> its PeftSpec (a run without `peft=lora` is a full fine-tune)."""
    if str(params.get("peft", "full")) != "lora":
        return FULL
    targets = str(params.get("lora_targets", "default"))
    return PeftSpec("lora", int(params.get("lora_r", DEFAULT_LORA_R)), int(params.get("lora_alpha", DEFAULT_LORA_ALPHA)),
                    () if targets == "default" else tuple(targets.split(",")),
                    float(params.get("lora_dropout", DEFAULT_LORA_DROPOUT)))


def variant_suffix(peft: PeftSpec, precision: str = "fp32") -> str:
    """The workload name's suffix: '' for full fine-tuning in fp32, else `+lora-r8a16`, `+bf16`, `+lora-r8a16+bf16`."""
    parts = [p for p in (peft.label, "" if precision == "fp32" else precision) if p]
    return "".join(f"+{p}" for p in parts)


def default_targets(model_type: str) -> tuple[str, ...]:
    """The modules peft adapts by default for this architecture (its own table)."""
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as table

    targets = table.get(str(model_type))
    if not targets:
        raise DvfsError(f"no default LoRA target modules are known for model_type {model_type!r}; "
                        "name them with --lora-targets (e.g. q_proj,v_proj)")
    return tuple(targets)


@contextlib.contextmanager
def _quiet_peft() -> Iterator[None]:
    """peft on transformers 5 calls a deprecated transformers property on every wrap (a FutureWarning the user cannot
    act on); only that message is hidden."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def apply_peft(model: torch.nn.Module, peft: PeftSpec, model_type: str, task_kind: str = "classification") -> torch.nn.Module:
    """The model wrapped for LoRA (base weights frozen; the task head trains), or the model itself for full
    fine-tuning. A target list that matches no module is one clear error line."""
    if not peft.is_lora:
        return model
    try:
        from peft import LoraConfig, TaskType, get_peft_model
    except ImportError:  # pragma: no cover - a declared dependency
        raise DvfsError("--peft lora needs the 'peft' package: pip install peft") from None
    targets = list(peft.targets or default_targets(model_type))
    task_type = TaskType.CAUSAL_LM if task_kind == "causal_lm" else TaskType.SEQ_CLS
    config = LoraConfig(r=peft.r, lora_alpha=peft.alpha, lora_dropout=peft.dropout, target_modules=targets, task_type=task_type)
    try:
        with _quiet_peft():
            return get_peft_model(model, config)
    except ValueError as e:  # peft's NoMatchingPeftModuleError and other target errors are ValueErrors
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m).__name__ in ("Linear", "Conv1D")})
        raise DvfsError(f"--lora-targets {','.join(targets)} match no module of this {model_type} model "
                        f"({type(e).__name__}); its linear layers are: {', '.join(linear[:16])}") from None


def count_trainable(model: torch.nn.Module) -> int:
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad))


def count_base(model: torch.nn.Module) -> int:
    """The model's parameters without LoRA's adapters (and without the frozen original of a head peft trains a copy
    of): what `num_params` means for a LoRA job, as for a full one."""
    return int(sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n and ".original_module." not in n))


def peft_of(model: torch.nn.Module) -> PeftSpec:
    """How a (possibly peft-wrapped) model in a user's Trainer is adapted: LoRA as its peft config says, else full."""
    configs = getattr(model, "peft_config", None)
    config = next(iter(configs.values()), None) if isinstance(configs, dict) and configs else None
    if config is None or str(getattr(config, "peft_type", "")).split(".")[-1].upper() != "LORA":
        return FULL
    targets = getattr(config, "target_modules", None) or ()
    targets = (targets,) if isinstance(targets, str) else tuple(sorted(targets))
    return PeftSpec("lora", int(config.r), int(config.lora_alpha), targets, float(getattr(config, "lora_dropout", 0.0) or 0.0))
