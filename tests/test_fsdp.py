"""FSDP through accelerate: configs/accelerate/fsdp.yaml as accelerate reads it, the wrap policy accelerate builds
from each model's `_no_split_modules`, and what the scripts say where accelerate cannot shard (on CPUs)."""

import subprocess
import sys

import pytest
import yaml
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

from fastformer import (
    FastformerForCausalLM,
    FastformerForConditionalGeneration,
    FastformerForMaskedLM,
    FastformerForSequenceClassification,
    FastformerModel,
)
from scripts import run_classification

HEADS = [
    FastformerModel,
    FastformerForSequenceClassification,
    FastformerForMaskedLM,
    FastformerForConditionalGeneration,
    FastformerForCausalLM,
]


@pytest.fixture(scope="module")
def fsdp_config(repo_root):
    return load_config_from_file(str(repo_root / "configs" / "accelerate" / "fsdp.yaml"))


def test_the_fsdp_config_is_fsdp2_wrapping_transformer_layers(fsdp_config):
    assert fsdp_config.distributed_type == DistributedType.FSDP and not fsdp_config.use_cpu
    settings = fsdp_config.fsdp_config
    assert settings["fsdp_version"] == 2 and settings["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert settings["fsdp_state_dict_type"] == "FULL_STATE_DICT"  # from_pretrained loads what Trainer saves


@pytest.mark.parametrize("head", HEADS, ids=lambda head: head.__name__)
def test_fsdp_wraps_every_module_of_the_classes_the_model_names(build, fsdp_config, head):
    settings = fsdp_config.fsdp_config
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=settings["fsdp_version"], auto_wrap_policy=settings["fsdp_auto_wrap_policy"].lower()
    )
    model = build(head)
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)  # raises for a named class the model does not have
    named = set(model._no_split_modules)
    wrapped = [module for module in model.modules() if policy(module)]
    assert {type(module).__name__ for module in wrapped} == named
    assert len(wrapped) == sum(type(module).__name__ in named for module in model.modules())  # every layer


SHARD = """
import os, sys, types
import torch, torch.distributed as dist
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_model
import fastformer
from fastformer import FastformerConfig

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
config = FastformerConfig(vocab_size=99, hidden_size=32, num_attention_heads=4, intermediate_size=37, num_labels=2)
for name in sys.argv[2:]:
    # a plugin per model (it keeps the class names of the first model it wraps); accelerate keeps its FSDP
    # plugin off the CPU (see the last test), so here are the attributes its FSDP2 preparation reads
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    accelerator = types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin), device=torch.device("cpu"),
                                        is_main_process=True, mixed_precision="no", torch_device_mesh=None)
    model = fsdp2_prepare_model(accelerator, getattr(fastformer, name)(config))
    ids = torch.randint(3, 99, (2, 8))
    labels = torch.tensor([0, 1]) if name == "FastformerForSequenceClassification" else ids
    output = model(input_ids=ids, **({} if name == "FastformerModel" else {"labels": labels}))
    (output.pooler_output.sum() if name == "FastformerModel" else output.loss).backward()
    sharded = all(type(parameter).__name__ == "DTensor" for parameter in model.parameters())
    print(name, "sharded" if sharded else "not sharded", all(p.grad is not None for p in model.parameters()))
"""


@pytest.mark.slow
def test_accelerate_shards_the_encoder_heads_and_the_causal_lm_with_fsdp2(tmp_path):
    """accelerate's FSDP2 preparation (fully_shard per wrapped module, then its own embedding group) on a
    one-process gloo group: every parameter becomes a DTensor, forward and backward run."""
    heads = [head.__name__ for head in HEADS if head is not FastformerForConditionalGeneration]
    process = subprocess.run(
        [sys.executable, "-c", SHARD, "29617", *heads], capture_output=True, text=True, timeout=300
    )
    assert process.returncode == 0, process.stderr[-3000:]
    assert process.stdout.split("\n")[:-1] == [f"{name} sharded True" for name in heads]


@pytest.mark.slow
def test_an_fsdp_config_on_cpus_trains_as_ddp_and_says_so(repo_root, tmp_path, accelerate_launch):
    """accelerate (1.15) turns FSDP on for accelerators only: on CPUs the processes run DDP, full replicas."""
    config = yaml.safe_load((repo_root / "configs" / "accelerate" / "fsdp.yaml").read_text())
    cpu = tmp_path / "fsdp_cpu.yaml"
    cpu.write_text(
        yaml.safe_dump({**config, "use_cpu": True, "num_processes": 2, "mixed_precision": "no", "gpu_ids": None})
    )
    train = tmp_path / "train.jsonl"
    train.write_text("".join((repo_root / "data" / "20newsgroups" / "train.jsonl").read_text().splitlines(True)[:16]))
    process = subprocess.run(
        [
            *accelerate_launch(cpu),
            run_classification.__file__,
            "--output_dir",
            str(tmp_path / "out"),
            "--do_train",
            "--train_file",
            str(train),
            "--max_seq_length",
            "32",
            "--max_steps",
            "1",
            "--per_device_train_batch_size",
            "2",
            "--model_type",
            "fastformer",
            "--config_overrides",
            "hidden_size=32,num_attention_heads=4,intermediate_size=64",
            "--use_cpu",
            "--report_to",
            "none",
            "--save_strategy",
            "no",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=repo_root,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    assert "FSDP was asked for (ACCELERATE_USE_FSDP), but accelerate runs FSDP on accelerators only" in (
        process.stdout + process.stderr
    )
