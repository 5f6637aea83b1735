"""A model read from a config.json is named after its file, with what the config says it is beside
it, so two configs of one architecture read apart; and a negative count in a config or a model is
refused by the rule it breaks (0 or more), not as a number that is not whole."""

import json

import pytest

from cost_models.errors import CpplanError
from cost_models.models import ModelSpec, get_model

pytestmark = pytest.mark.pure

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
}


def _write(path, config: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return path


def test_two_configs_of_one_architecture_have_two_names(tmp_path):
    wide = _write(tmp_path / "llama-wide" / "config.json", {**LLAMA, "hidden_size": 128})
    narrow = _write(tmp_path / "llama-narrow" / "config.json", LLAMA)
    names = {get_model(str(wide)).name, get_model(str(narrow.parent)).name}
    assert names == {"llama-wide (LlamaForCausalLM)", "llama-narrow (LlamaForCausalLM)"}


def test_a_config_not_called_config_json_is_named_after_its_stem(tmp_path):
    path = _write(tmp_path / "draft-7.json", {**LLAMA, "_name_or_path": "meta-llama/Llama-3.2-1B"})
    assert get_model(str(path)).name == "draft-7 (meta-llama/Llama-3.2-1B)"


def test_a_config_without_an_architecture_keeps_its_model_type_visible(tmp_path):
    config = {k: v for k, v in LLAMA.items() if k != "architectures"}
    assert get_model(str(_write(tmp_path / "mine" / "config.json", config))).name == "mine (llama)"


def test_a_negative_max_window_layers_is_refused_by_its_rule(tmp_path):
    config = {**LLAMA, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 128}
    path = _write(tmp_path / "config.json", {**config, "max_window_layers": -2})
    with pytest.raises(CpplanError) as refused:
        get_model(str(path))
    assert "max_window_layers=-2 must be an integer of 0 or more" in str(refused.value)
    assert "whole number" not in str(refused.value)


@pytest.mark.parametrize("field", ["window", "documents"])
def test_a_negative_window_or_document_length_is_refused_by_its_rule(field):
    with pytest.raises(CpplanError, match=f"{field}=-2 must be an integer of 0 or more") as refused:
        ModelSpec("m", 2, 64, 4, 2, 16, 128, 256, **{field: -2})
    assert "whole number" not in str(refused.value)
