"""Random-weight models: the public Qwen2.5 shapes (never instantiated here), and a tiny model
that transformers loads and vLLM's CPU attention accepts."""

from __future__ import annotations

import json

import pytest

from prefixshield.live.tinymodel import (ARCHS, MARKER_FILE, head_dim, model_config,
                                             num_parameters, parameter_shapes, write_tiny_model)


def test_qwen25_configs_are_the_public_ones():
    c15 = model_config("qwen2.5-1.5b")
    assert {k: c15[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "vocab_size",
                                "max_position_embeddings", "rope_theta", "rms_norm_eps",
                                "tie_word_embeddings", "torch_dtype")} == {
        "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
        "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
    c7 = model_config("qwen2.5-7b")
    assert {k: c7[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "num_key_value_heads", "vocab_size",
                               "max_position_embeddings", "tie_word_embeddings")} == {
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
        "max_position_embeddings": 32768, "tie_word_embeddings": False}
    assert model_config("qwen2.5-7b") is not ARCHS["qwen2.5-7b"]   # a copy


def test_parameter_counts_match_the_published_sizes():
    assert num_parameters("qwen2.5-1.5b") == 1_543_714_304   # "1.54B"
    assert num_parameters("qwen2.5-7b") == 7_615_616_512     # "7.61B"
    shapes = parameter_shapes("qwen2.5-7b")
    assert shapes["lm_head.weight"] == (152064, 3584)          # untied
    assert "lm_head.weight" not in parameter_shapes("qwen2.5-1.5b")  # tied
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (512, 3584)


def test_tiny_model_has_cpu_friendly_shapes():
    assert head_dim("tiny-qwen2") == 64
    c = model_config("tiny-qwen2")
    assert c["vocab_size"] == 1000 and c["max_position_embeddings"] >= 8192
    assert c["num_hidden_layers"] == 2 and c["num_key_value_heads"] in (1, 2)


def test_unknown_architecture_lists_the_known():
    with pytest.raises(KeyError, match="tiny-qwen2"):
        model_config("llama-70b")


def test_tiny_model_loads_in_transformers_and_is_deterministic(tmp_path, tiny_model_dir):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.num_attention_heads == 2
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 1000)
    again = write_tiny_model(tmp_path / "again", seed=0)
    a = load_file(f"{tiny_model_dir}/model.safetensors")
    b = load_file(str(again / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    info = json.loads((again / MARKER_FILE).read_text())
    assert info["arch"] == "tiny-qwen2" and info["num_parameters"] == num_parameters()


def test_sharded_writing_produces_an_index_that_loads(tmp_path):
    from transformers import AutoModelForCausalLM

    out = write_tiny_model(tmp_path / "sharded", max_shard_bytes=400_000, dtype="bfloat16")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert sum(p.numel() for p in model.parameters()) == num_parameters()


def test_existing_directory_is_not_overwritten_by_accident(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        write_tiny_model(tmp_path / "m")
    assert (tmp_path / "m" / "keep.txt").exists()
    write_tiny_model(tmp_path / "m", overwrite=True)
    assert not (tmp_path / "m" / "keep.txt").exists()
