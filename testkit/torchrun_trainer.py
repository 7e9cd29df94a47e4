"""A user's own Trainer script under `torchrun` with DvfsCallback, for tests/test_multigpu.py: bert-tiny on a few
synthetic SST-2 examples, on the CPU (gloo), each rank on the fake NVML GPU the shim's `pynvml` gives it.

    python -m torch.distributed.run --standalone --nproc-per-node 2 testkit/torchrun_trainer.py OUT FREQ0 FREQ1

Rank r asks DvfsCallback for clock FREQ<r> (rank 0's decision is the one every rank must run at); at each step the
rank records every fake GPU's lock as the shared state holds it; rank 0 alone starts an MLflow run. Each rank writes
OUT/rank<r>.json: what it saw, its decision, its report and (after training) every rank's GPU; then every rank asks
for a decision rank 0 cannot make, and writes the error it got.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path


def main() -> None:
    import mlflow
    import pynvml  # the test's shim: the shared fake GPUs
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from dvfs_mlops.hw import open_device
    from dvfs_mlops.integrations.transformers import DvfsCallback
    from dvfs_mlops.job.finetune import build_model
    from dvfs_mlops.job.workloads.prepare import prepare_workload
    from dvfs_mlops.job.workloads.tokenizer import collate as pad

    out, freqs = Path(sys.argv[1]), [int(f) for f in sys.argv[2:4]]
    rank = int(os.environ["RANK"])
    w = prepare_workload("bert-tiny", "sst2", train_size=32, dev_size=8)

    class TrainSplit(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(w.train)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": w.train.ids[i], "labels": int(w.train.labels[i])}

    def collate(items: list[dict]) -> dict:
        ids, mask = pad([x["input_ids"] for x in items], w.encoder.pad_id)
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask), "labels": torch.tensor([x["labels"] for x in items])}

    seen: list[list] = []

    die_at = int(os.environ.get("TEST_RANK1_DIES_AT_STEP", "0"))  # the test's own switch: rank 1 SIGKILLs itself

    class Probe(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            seen.append([g.locked and list(g.locked) for g in pynvml._gpus])
            if rank == 1 and state.global_step == die_at:
                os.kill(os.getpid(), signal.SIGKILL)

    args = TrainingArguments(output_dir=str(out / f"rank{rank}"), max_steps=3, per_device_train_batch_size=4, report_to=[],
                             use_cpu=True, ddp_backend="gloo", save_strategy="no", logging_strategy="no", disable_tqdm=True)
    run = mlflow.start_run(experiment_id=mlflow.create_experiment("user-script")) if rank == 0 else contextlib.nullcontext()
    with run, DvfsCallback(device=open_device("nvml", assume_unlocked=True, sample_hz=20), freq=freqs[rank], gpu_util_pct=60.0,
                           announce=print, torch_device="cpu", warmup_steps=0) as dvfs:
        Trainer(model=build_model(w.model_config, seed=0), args=args, train_dataset=TrainSplit(), data_collator=collate,
                callbacks=[dvfs, Probe()]).train()
    # A decision rank 0 cannot make (no such governor): every rank fails with it, none waits for a broadcast forever.
    failing = DvfsCallback(governor="models:/no-such-governor@production", announce=None)
    failing._group = torch.distributed
    try:
        failing._decide_once(None, 4, dvfs.features)
        decide_error = None
    except Exception as e:  # noqa: BLE001 - reported to the test as it is
        decide_error = f"{type(e).__name__}: {e}"
    (out / f"rank{rank}.json").write_text(json.dumps({"decide_error": decide_error,
        "rank": rank, "seen": seen, "freq": dvfs.decision.freq_mhz, "index": dvfs.device.index, "energy_j": dvfs.report.energy_j,
        "gpus": [g.to_dict() for g in dvfs.gpus], "job_energy_j": dvfs.job_report.energy_j}))
    # As PyTorch asks of every script that made a process group: left to the interpreter's exit, gloo's threads can
    # still be running when its process group is destroyed, and the process aborts ("terminate called without an
    # active exception", SIGABRT) after all of the above succeeded.
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
