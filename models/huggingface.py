"""Hugging Face ``transformers`` language models, built from a config (nothing is downloaded):
``--model hf-causal-lm --model-options '{"model_type": "gpt2", "n_layer": 2, ...}'``.

The model takes the batch's dict as keyword arguments (``input_ids``, ``attention_mask``, ``labels``)
and returns a ``ModelOutput`` whose ``.loss`` the harness trains on (harness/training/losses.py).
The vocabulary is the option ``vocab_size`` or else the data's (``DataInfo.num_classes``).
"""
from __future__ import annotations

from typing import Any

from torch import nn


def hf_causal_lm(info: Any, model_type: str = "gpt2", **config: Any) -> nn.Module:
    try:
        import transformers
    except ImportError:
        raise ValueError("--model hf-causal-lm needs the transformers package: pip install -e '.[hf]'") from None
    if "vocab_size" not in config and info.num_classes:
        config["vocab_size"] = info.num_classes
    try:
        settings = transformers.AutoConfig.for_model(model_type, **config)
    except (ValueError, TypeError) as e:
        raise ValueError(f"hf-causal-lm: {str(e).splitlines()[0]}") from None
    model = transformers.AutoModelForCausalLM.from_config(settings)
    # transformers picks the loss from the class name, and "GPT2LMHeadModel" names none: it would then log a
    # warning from inside every forward, which torch.compile cannot trace, and the compiled step would break
    # between the model and its loss (the logits then leave the graph, in float32 for the loss).
    if getattr(model, "loss_type", None) is None:
        model.loss_type = "ForCausalLM"
    return model
