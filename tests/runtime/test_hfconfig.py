"""`init-run --model-config / --preset`: a Hugging Face config.json as the manifest's model, parameter counts,
and the one-line refusals of what cannot be built or cut (model/hfconfig.py, model/presets.py, cli/initrun.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gwtf_node.cli import main
from gwtf_node.model.hfconfig import family_config, parameter_counts
from gwtf_node.model.manifest import FAMILIES, load_manifest

SMOLLM = Path(__file__).resolve().parents[1] / "data" / "smollm-135m-config.json"
SMOLLM_PARAMS = 134_515_008


def _meta_count(model_cls, config) -> int:
    with torch.device("meta"):
        model = model_cls(config)
    return sum(p.numel() for p in model.parameters())


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("error: "), err
    return err


def test_smollm_config_cut_into_4_stages(tmp_path: Path, capsys) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path / "run.json"
    assert main(["init-run", "--out", str(out), "--model-config", str(SMOLLM), "--stages", "4"]) == 0
    printed = capsys.readouterr().out
    assert f"{SMOLLM_PARAMS:,}" in printed and "134.5M parameters" in printed
    man = load_manifest(out)
    assert man.model.family == "llama" and man.num_stages == 4
    assert man.stages == [(0, 8), (8, 16), (16, 23), (23, 30)]
    cfg = man.model.config
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["tie_word_embeddings"]) == (9, 3, True)
    assert cfg["rope_parameters"]["rope_theta"] == 10000.0 and cfg["rms_norm_eps"] == 1e-5
    assert "torch_dtype" not in cfg and "architectures" not in cfg and "transformers_version" not in cfg
    # transformers' own model built from the raw config.json, and from the manifest's dict: the same count
    raw = json.loads(SMOLLM.read_text())
    assert _meta_count(LlamaForCausalLM, LlamaConfig(**raw)) == SMOLLM_PARAMS
    assert _meta_count(LlamaForCausalLM, LlamaConfig(**cfg)) == SMOLLM_PARAMS
    counts = parameter_counts("llama", cfg)
    assert counts.total == SMOLLM_PARAMS == counts.data + sum(counts.stage(s, e) for s, e in man.stages)
    assert counts.data == 49152 * 576 + 576  # one tied embedding/head and the final norm


@pytest.mark.parametrize("preset, family, params", [
    ("gpt2-small", "gpt", 124_439_808),
    ("llama-135m", "llama", SMOLLM_PARAMS),
    ("llama-1b", "llama", 1_235_814_400),
])
def test_presets(tmp_path: Path, capsys, preset: str, family: str, params: int) -> None:
    from gwtf_node.model.hfconfig import config_class, model_class

    out = tmp_path / "run.json"
    assert main(["init-run", "--out", str(out), "--preset", preset, "--stages", "4"]) == 0
    assert f"{params:,}" in capsys.readouterr().out
    man = load_manifest(out)
    assert man.model.family == family and man.num_stages == 4
    assert _meta_count(model_class(family), config_class(family)(**man.model.config)) == params


def test_tiny_preset_is_the_default(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "run.json", tmp_path / "b" / "run.json"
    for p in (a, b):
        p.parent.mkdir()
    assert main(["init-run", "--out", str(a)]) == 0
    assert main(["init-run", "--out", str(b), "--preset", "tiny"]) == 0
    assert load_manifest(a).model == load_manifest(b).model


def test_gpt2_config_keeps_its_tie_and_leaves_the_summary_keys_out() -> None:
    family, cfg, ignored = family_config({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4,
                                         "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                                         "task_specific_params": {"x": 1}})
    assert family == "gpt" and cfg["tie_word_embeddings"] is True and cfg["n_layer"] == 2
    assert not any(k.startswith("summary_") for k in cfg) and ignored == ["task_specific_params"]


def _variant(tmp_path: Path, **changes) -> str:
    d = json.loads(SMOLLM.read_text())
    d.update(changes)
    d = {k: v for k, v in d.items() if v != "DROP"}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    return str(p)


@pytest.mark.parametrize("changes, expect", [
    ({"model_type": "bert"}, "model_type 'bert' is not supported"),
    ({"model_type": "DROP"}, "has no model_type"),
    ({"num_local_experts": 8, "num_experts_per_tok": 2}, "num_local_experts = 8: mixture-of-experts"),
    ({"rope_scaling": {"rope_type": "warp", "factor": 2.0}}, "rope_scaling.rope_type = 'warp'"),
    ({"num_key_value_heads": 4}, "num_key_value_heads = 4: it must divide num_attention_heads (9)"),
    ({"attention_dropout": 0.1}, "model.config.attention_dropout = 0.1: dropout is not supported"),
    ({"hidden_act": "sparkle"}, "hidden_act = 'sparkle': transformers has no such activation"),
    ({"num_hidden_layers": 3}, "4 stages but only 3 layers"),
])
def test_what_cannot_be_built_or_cut_is_one_line(tmp_path: Path, capsys, changes: dict, expect: str) -> None:
    err = _one_line_error(capsys, ["init-run", "--out", str(tmp_path / "run.json"), "--model-config",
                                   _variant(tmp_path, **changes), "--stages", "4"])
    assert expect in err, err
    assert not (tmp_path / "run.json").exists()


def test_gpt2_default_dropout_is_refused(tmp_path: Path, capsys) -> None:
    p = tmp_path / "gpt2.json"
    p.write_text(json.dumps({"model_type": "gpt2", "n_layer": 4}))
    err = _one_line_error(capsys, ["init-run", "--out", str(tmp_path / "r.json"), "--model-config", str(p)])
    assert "pdrop = 0.1: dropout is not supported" in err


@pytest.mark.parametrize("argv, expect", [
    (["--preset", "llama-135m", "--model-config", "x.json"], "not --preset and --model-config"),
    (["--preset", "tiny", "--hidden", "32"], "not --preset and --hidden"),
    (["--model-config", "x.json", "--family", "gpt"], "not --model-config and --family"),
    (["--preset", "huge"], "--preset 'huge' is unknown; use one of tiny, gpt2-small, llama-135m, llama-1b"),
    (["--model-config", "/no/such/config.json"], "--model-config /no/such/config.json: no such file"),
])
def test_flag_errors_are_one_line(tmp_path: Path, capsys, argv: list[str], expect: str) -> None:
    err = _one_line_error(capsys, ["init-run", "--out", str(tmp_path / "run.json"), *argv])
    assert expect in err, err


def test_a_config_that_is_not_json(tmp_path: Path, capsys) -> None:
    p = tmp_path / "config.json"
    p.write_text("{not json")
    assert "is not JSON" in _one_line_error(capsys, ["init-run", "--out", str(tmp_path / "r.json"),
                                                     "--model-config", str(p)])


@pytest.mark.parametrize("model_type, cls_name", [("mistral", "MistralForCausalLM"), ("qwen2", "Qwen2ForCausalLM")])
def test_mistral_and_qwen2(tmp_path: Path, capsys, model_type: str, cls_name: str) -> None:
    import transformers

    assert model_type in FAMILIES
    cfg = _variant(tmp_path, model_type=model_type)
    out = tmp_path / "run.json"
    assert main(["init-run", "--out", str(out), "--model-config", cfg, "--stages", "4"]) == 0
    man = load_manifest(out)
    assert man.model.family == model_type and man.model.config["num_key_value_heads"] == 3
    config_cls = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))
    expect = _meta_count(getattr(transformers, cls_name), config_cls(**json.loads(Path(cfg).read_text())))
    assert f"{expect:,}" in capsys.readouterr().out
