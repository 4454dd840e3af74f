"""Random-weight models with a named architecture, written locally (no model hub, no tokenizer).

Step time depends on a model's shapes, not on its weight values, and greedy decoding with forced
output lengths (``min_tokens = max_tokens``, ``ignore_eos``) makes the token values irrelevant to
the cache. So the live mode and calibration need only a directory that vLLM can load with
``skip_tokenizer_init=True`` and token-id prompts: a ``config.json`` plus safetensors weights.

Architectures (`ARCHS`):

* ``tiny-qwen2`` — Qwen2, 2 layers, hidden 128, 2 attention heads and 1 KV head (head_dim 64:
  vLLM's CPU attention rejects head_dim 16 and accepts 64), intermediate 256, vocab 1000 (the
  trace default), 8192 positions; float32 (424,064 parameters, 1.7 MB).
* ``qwen2.5-1.5b`` / ``qwen2.5-7b`` — exactly the public ``config.json`` of
  ``Qwen/Qwen2.5-1.5B-Instruct`` / ``Qwen/Qwen2.5-7B-Instruct`` (values written below, not
  downloaded); bfloat16. Note the 7B vocabulary is 152,064 (its embedding is padded), not the
  151,936 of the 0.5B-3B models.

Weights are generated tensor by tensor from the parameter shapes of a model built on PyTorch's
``meta`` device (no memory), in row chunks, and streamed into safetensors shards of at most
``max_shard_bytes`` — so the 7B model (15.2 GB in bf16) never exists in memory at once.
Values: linear and embedding weights ``N(0, initializer_range)``, biases 0, RMSNorm weights 1;
deterministic for a given ``seed``.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

ARCHS: dict[str, dict[str, Any]] = {
    "tiny-qwen2": {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "hidden_act": "silu",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "intermediate_size": 256,
        "max_position_embeddings": 8192,
        "max_window_layers": 2,
        "model_type": "qwen2",
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 8192,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 1000,
    },
    # Qwen/Qwen2.5-1.5B-Instruct config.json (public values)
    "qwen2.5-1.5b": {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "hidden_act": "silu",
        "hidden_size": 1536,
        "initializer_range": 0.02,
        "intermediate_size": 8960,
        "max_position_embeddings": 32768,
        "max_window_layers": 21,
        "model_type": "qwen2",
        "num_attention_heads": 12,
        "num_hidden_layers": 28,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    # Qwen/Qwen2.5-7B-Instruct config.json (public values)
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "hidden_act": "silu",
        "hidden_size": 3584,
        "initializer_range": 0.02,
        "intermediate_size": 18944,
        "max_position_embeddings": 32768,
        "max_window_layers": 28,
        "model_type": "qwen2",
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 131072,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 152064,
    },
}
"""Architecture name -> the ``config.json`` written for it."""

SOURCES = {
    "tiny-qwen2": "prefixshield test model (Qwen2 architecture, tiny shapes)",
    "qwen2.5-1.5b": "shapes of Qwen/Qwen2.5-1.5B-Instruct (public config.json)",
    "qwen2.5-7b": "shapes of Qwen/Qwen2.5-7B-Instruct (public config.json)",
}

MARKER_FILE = "prefixshield_model.json"
"""Written beside the weights: architecture, seed, dtype, parameter count, 'random weights'."""


def model_config(arch: str = "tiny-qwen2") -> dict[str, Any]:
    """The ``config.json`` dict of ``arch`` (a copy); unknown names raise ``KeyError``.

    This is the dry run of `write_tiny_model`: nothing is built or written.
    """
    try:
        return copy.deepcopy(ARCHS[arch])
    except KeyError:
        raise KeyError(f"unknown architecture {arch!r}; known: {', '.join(ARCHS)}") from None


def head_dim(arch: str = "tiny-qwen2") -> int:
    """Attention head dimension of ``arch`` (``hidden_size / num_attention_heads``)."""
    c = model_config(arch)
    return c["hidden_size"] // c["num_attention_heads"]


def parameter_shapes(arch: str = "tiny-qwen2") -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor the checkpoint holds (tied ``lm_head`` excluded).

    Built on PyTorch's ``meta`` device with ``transformers``: no memory, no download.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg_dict = model_config(arch)
    cfg = AutoConfig.for_model(**{k: v for k, v in cfg_dict.items() if k != "model_type"},
                               model_type=cfg_dict["model_type"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if cfg_dict.get("tie_word_embeddings"):
        shapes.pop("lm_head.weight", None)
    return dict(sorted(shapes.items()))


def num_parameters(arch: str = "tiny-qwen2") -> int:
    """Parameters stored in the checkpoint of ``arch`` (tied embeddings counted once)."""
    return sum(math.prod(s) for s in parameter_shapes(arch).values())


def _dtype_of(arch: str, dtype: str | None):
    import torch

    name = dtype or model_config(arch)["torch_dtype"]
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in table:
        raise ValueError(f"dtype must be one of {', '.join(table)}, got {name!r}")
    return name, table[name]


def _fill(name: str, shape: tuple[int, ...], std: float, gen, dtype, max_chunk_elems: int):
    """The tensor ``name``: zeros (bias), ones (norm weight) or N(0, std), built in row chunks."""
    import torch

    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=dtype)
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype)
    out = torch.empty(shape, dtype=dtype)
    rows = shape[0]
    per_row = max(1, math.prod(shape[1:]))
    step = max(1, max_chunk_elems // per_row)
    for r in range(0, rows, step):
        chunk = torch.randn((min(step, rows - r),) + tuple(shape[1:]), generator=gen,
                            dtype=torch.float32)
        out[r:r + chunk.shape[0]] = (chunk * std).to(dtype)
    return out


def write_tiny_model(out_dir: str | os.PathLike, arch: str = "tiny-qwen2", seed: int = 0,
                     dtype: str | None = None, max_shard_bytes: int = 2 << 30,
                     overwrite: bool = False) -> Path:
    """Write a random-weight model of architecture ``arch`` to ``out_dir``; returns the path.

    Args:
        out_dir: target directory; must not exist (or be empty) unless ``overwrite``. The model is
            written into a temporary sibling directory and renamed at the end, so a crash never
            leaves a half-written model under ``out_dir``.
        arch: a key of `ARCHS`.
        seed: RNG seed; the same seed gives bit-identical weights.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (None: the architecture's own,
            float32 for tiny-qwen2, bfloat16 for the Qwen2.5 shapes).
        max_shard_bytes: largest safetensors shard in bytes (an index file is written when
            there is more than one shard).
        overwrite: replace an existing non-empty ``out_dir``.

    Files: ``config.json``, ``model.safetensors`` (or ``model-0000k-of-0000n.safetensors`` +
    ``model.safetensors.index.json``) and `MARKER_FILE`. No tokenizer: run vLLM with
    ``skip_tokenizer_init=True`` and token-id prompts.
    """
    import torch
    from safetensors.torch import save_file

    cfg = model_config(arch)
    dtype_name, torch_dtype = _dtype_of(arch, dtype)
    cfg["torch_dtype"] = dtype_name
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out}: directory exists and is not empty (pass overwrite=True)")
    out.parent.mkdir(parents=True, exist_ok=True)
    shapes = parameter_shapes(arch)
    elem_bytes = torch.tensor([], dtype=torch_dtype).element_size()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        gen = torch.Generator().manual_seed(int(seed))
        std = float(cfg["initializer_range"])
        shards: list[dict[str, Any]] = [{}]
        shard_bytes = 0
        files: list[str] = []
        weight_map: dict[str, int] = {}
        total = 0

        def flush() -> None:
            files.append(f"shard{len(files)}")
            save_file(shards[-1], str(tmp / f"{files[-1]}.tmp"), metadata={"format": "pt"})
            shards[-1] = {}

        for name, shape in shapes.items():
            nbytes = math.prod(shape) * elem_bytes
            if shards[-1] and shard_bytes + nbytes > max_shard_bytes:
                flush()
                shard_bytes = 0
            shards[-1][name] = _fill(name, shape, std, gen, torch_dtype, 1 << 24)
            weight_map[name] = len(files)
            shard_bytes += nbytes
            total += nbytes
        flush()
        n = len(files)
        names = (["model.safetensors"] if n == 1 else
                 [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])
        for i, f in enumerate(files):
            os.replace(tmp / f"{f}.tmp", tmp / names[i])
        if n > 1:
            index = {"metadata": {"total_size": total},
                     "weight_map": {k: names[v] for k, v in weight_map.items()}}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        marker = {"arch": arch, "source": SOURCES[arch], "seed": int(seed), "dtype": dtype_name,
                  "num_parameters": sum(math.prod(s) for s in shapes.values()),
                  "weights": "random (N(0, initializer_range); biases 0; norms 1)",
                  "tokenizer": "none: use skip_tokenizer_init=True and token-id prompts"}
        (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
