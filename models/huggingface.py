"""Hugging Face ``transformers`` language models, built from a config (nothing is downloaded):
``--model hf-causal-lm --model-options '{"model_type": "gpt2", "n_layer": 2, ...}'``.

The model takes the batch's dict as keyword arguments (``input_ids``, ``attention_mask``, ``labels``)
and returns a ``ModelOutput`` whose ``.loss`` the harness trains on (harness/training/losses.py).
The vocabulary is the option ``vocab_size`` or else the data's (``DataInfo.num_classes``). An option
the config does not know but that is close to one it does (``n_layers``) is refused, naming the one meant.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from harness.spelling import did_you_mean


def hf_causal_lm(info: Any, model_type: str = "gpt2", **config: Any) -> nn.Module:
    try:
        import transformers
    except ImportError:
        raise ValueError("--model hf-causal-lm needs the transformers package: pip install -e '.[hf]'") from None
    if "vocab_size" not in config and info.num_classes:
        config["vocab_size"] = info.num_classes
    try:
        _refuse_misspelled(transformers.AutoConfig.for_model(model_type), config)
        settings = transformers.AutoConfig.for_model(model_type, **config)
    except Exception as e:      # transformers' own errors too (a strict dataclass's field of the wrong type)
        raise ValueError(f"hf-causal-lm: {' '.join(str(e).split())}") from None
    model = transformers.AutoModelForCausalLM.from_config(settings)
    # transformers picks the loss from the class name, and "GPT2LMHeadModel" names none: it would then log a
    # warning from inside every forward, which torch.compile cannot trace, and the compiled step would break
    # between the model and its loss (the logits then leave the graph, in float32 for the loss).
    if getattr(model, "loss_type", None) is None:
        model.loss_type = "ForCausalLM"
    return model


def _refuse_misspelled(default: Any, given: dict[str, Any]) -> None:
    """A ValueError for an option the config does not know that is close to one it does (``n_layers`` for
    ``n_layer``): a config takes any keyword and keeps it as an attribute, so a misspelled size would otherwise
    build the default model without a word. Other unknown keywords pass (transformers' own, such as
    ``attn_implementation``)."""
    import inspect
    known = set(default.to_dict()) | set(getattr(type(default), "attribute_map", {})) | \
        set(inspect.signature(type(default).__init__).parameters)
    for name in given:
        guess = did_you_mean(name, sorted(known), cutoff=0.8) if name not in known else ""
        if guess:
            raise ValueError(f"{type(default).__name__} has no option '{name}'{guess}")
