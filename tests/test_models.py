import importlib
import re
import sys

import pytest
import torch

from harness.checkout.datasets import DataInfo
from harness.checkout.models import MODELS, build_model, loss_fn, model_names

DIGITS = DataInfo("image", (1, 8, 8), 10)
MNIST = DataInfo("image", (1, 28, 28), 10)
CIFAR = DataInfo("image", (3, 32, 32), 10)
TOKENS = DataInfo("tokens", (16,), 50)


def sample_input(info: DataInfo, n: int = 2) -> torch.Tensor:
    if info.kind == "tokens":
        return torch.randint(info.num_classes, (n, *info.input_shape))
    return torch.rand(n, *info.input_shape)


def tiny_factory(info, width: int = 3) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(info.input_shape[0], width))


def named_factory(info, name: str, what: str, signature: str) -> torch.nn.Module:
    """Options named as build_model's and check_call's own parameters (a checkpoint's name, say)."""
    return torch.nn.Linear(info.input_shape[0], len(name + what + signature))


def test_registry_lists_all_models():
    assert model_names() == sorted(MODELS) == ["cnn", "gpt", "hf-causal-lm", "mlp", "oddeven", "resnet18", "resnet50"]


@pytest.mark.parametrize(
    "name, info",
    [
        ("oddeven", DataInfo("vector", (10,), 2)),
        ("mlp", MNIST),
        ("cnn", DIGITS),
        ("cnn", MNIST),
        ("cnn", CIFAR),
        ("resnet18", CIFAR),
        ("resnet18", DIGITS),
        ("resnet50", CIFAR),
        ("gpt", TOKENS),
    ],
)
def test_model_outputs_logits_of_the_right_shape(name, info):
    torch.manual_seed(0)
    model = build_model(name, info)
    x = sample_input(info)
    out = model(x)
    # a language model's vocabulary is padded to a multiple of 64 (its padded logits never win)
    padded = -(-info.num_classes // 64) * 64
    expected = (2, *info.input_shape, padded) if info.kind == "tokens" else (2, info.num_classes)
    assert out.shape == expected
    target = torch.randint(info.num_classes, expected[:-1])
    assert loss_fn(out, target).shape == ()


def test_mlp_is_784_512_512_10_on_mnist():
    linears = [m for m in build_model("mlp", MNIST) if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(784, 512), (512, 512), (512, 10)]
    hidden = build_model("mlp", MNIST, hidden=(32,))
    assert [m.out_features for m in hidden if isinstance(m, torch.nn.Linear)] == [32, 10]


def test_resnet50_has_imagenet_parameter_count():
    with torch.device("meta"):
        model = build_model("resnet50", DataInfo("image", (3, 224, 224), 1000))
    assert sum(p.numel() for p in model.parameters()) == 25_557_032


def test_gpt_ties_embedding_and_output_weights():
    model = build_model("gpt", TOKENS)
    assert model.lm_head.weight is model.wte.weight
    references = list(model.named_parameters(remove_duplicate=False))
    assert sum(1 for _ in model.parameters()) == len(references) - 1  # the shared weight is counted once


def test_gpt_is_causal():
    torch.manual_seed(0)
    model = build_model("gpt", TOKENS, n_layer=1, n_head=2, n_embd=16)
    x = sample_input(TOKENS)
    changed = x.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % TOKENS.num_classes
    torch.testing.assert_close(model(x)[:, :10], model(changed)[:, :10])
    assert not torch.allclose(model(x)[:, 10:], model(changed)[:, 10:])


def test_gpt_124m_preset_is_gpt2_small_with_its_vocabulary_padded_to_a_multiple_of_64():
    with torch.device("meta"):
        model = build_model("gpt", DataInfo("tokens", (1024,), 50257), size="124m")
    assert sum(p.numel() for p in model.parameters()) == 124_439_808 + (50304 - 50257) * 768
    assert model.wte.weight.shape == (50304, 768)


def test_a_padded_vocabulary_leaves_the_loss_and_predictions_on_the_real_one():
    """vocab 61 pads to 64: the padded logits never win, and the loss equals cross-entropy over the
    61 real logits alone (computed here by hand), gradients included."""
    info = DataInfo("tokens", (12,), 61)
    model = build_model("gpt", info, n_layer=1, n_head=2, n_embd=16)
    x, y = torch.randint(0, 61, (3, 12)), torch.randint(0, 61, (3, 12))
    logits = model(x)
    assert logits.shape == (3, 12, 64) and (logits.argmax(-1) < 61).all()
    real = logits[..., :61]
    by_hand = (real.logsumexp(-1) - real.gather(-1, y[..., None]).squeeze(-1)).mean()
    assert torch.allclose(loss_fn(logits, y), by_hand, atol=1e-6)
    loss_fn(logits, y).backward()
    assert model.wte.weight.grad[61:].abs().max() == 0


@pytest.mark.parametrize(
    "options, match",
    [({"size": "7b"}, "unknown gpt size '7b'; valid sizes: tiny, 124m"), ({"n_layers": 2}, r"\['n_layers'\]")],
)
def test_gpt_bad_options_raise(options, match):
    with pytest.raises(ValueError, match=match):
        build_model("gpt", TOKENS, **options)


def test_gpt_rejects_sequences_longer_than_block_size():
    model = build_model("gpt", TOKENS, block_size=8)
    with pytest.raises(ValueError, match="sequence length 16 exceeds block_size 8"):
        model(sample_input(TOKENS))


def test_image_model_rejects_token_data():
    with pytest.raises(ValueError, match=r"--model cnn needs image data but the dataset \(--dataset\) is tokens data"):
        build_model("cnn", TOKENS)


def test_module_factory_form_builds_user_model():
    model = build_model(f"{__name__}:tiny_factory", DataInfo("vector", (4,), 2), width=5)
    assert model(torch.rand(2, 4)).shape == (2, 5)


def test_a_factory_s_options_may_be_named_as_the_harness_s_own_arguments():
    """--model-options '{"name": ...}' met build_model's own ``name``: "got multiple values for argument 'name'"."""
    model = build_model(f"{__name__}:named_factory", DataInfo("vector", (4,), 2), name="ab", what="c", signature="")
    assert model.out_features == 3


@pytest.mark.parametrize(
    "name, match",
    [
        ("vgg", "unknown model 'vgg'; valid names: cnn, gpt, hf-causal-lm, mlp, oddeven, resnet18, resnet50, or 'package.module:fac"),
        ("no_such_module_xyz:make", "cannot import module 'no_such_module_xyz'"),
        (f"{__name__}:missing", f"module '{__name__}' has no callable 'missing'"),
    ],
)
def test_bad_model_names_raise(name, match):
    with pytest.raises(ValueError, match=match):
        build_model(name, DIGITS)


def test_a_model_module_named_as_one_that_comes_first_or_as_a_file_or_the_script_is_named_with_the_fix(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "test.py").write_text("def make(info):\n    pass\n")      # the standard library's test comes first
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path)])      # last, as Train.py puts its folder
    cases = [("test:make", f"it is {importlib.import_module('test').__file__}, which comes before your "
                           f"{tmp_path / 'test.py'} on the path; rename your file"),
             ("mine.py:make", "names a file: give the module's name without .py, 'mine:make'"),
             ("__main__:make", "names the running script, which the workers do not run: put make in a module file")]
    for name, match in cases:
        with pytest.raises(ValueError, match=re.escape(match)):
            build_model(name, DIGITS)


def test_a_models_py_of_the_user_s_own_is_the_bare_name_models(tmp_path, monkeypatch):
    (tmp_path / "models.py").write_text("import torch\ndef make(info):\n    return torch.nn.Linear(64, 3)\n")
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path)])      # last, as Train.py puts its folder
    monkeypatch.delitem(sys.modules, "models", raising=False)
    assert build_model("models:make", DIGITS).out_features == 3
    assert sys.modules["models"].__file__ == str(tmp_path / "models.py")
    monkeypatch.delitem(sys.modules, "models")


def test_loss_fn_handles_tokens_like_flat_classes():
    """Cross-entropy by hand: the mean over every position of minus the log-softmax at the target."""
    logits, target = torch.randn(2, 3, 5, dtype=torch.float64), torch.randint(5, (2, 3))
    expected = -torch.stack([logits[n, t].log_softmax(-1)[target[n, t]] for n in range(2) for t in range(3)]).mean()
    torch.testing.assert_close(loss_fn(logits, target), expected)                           # (N, T, V) / (N, T)
    torch.testing.assert_close(loss_fn(logits.reshape(6, 5), target.reshape(6)), expected)  # (N, C) / (N,)


def test_a_hugging_face_causal_lm_computes_its_loss_in_the_graph_of_its_forward():
    """--compile compiles model and loss together: a graph break between them would hold the logits."""
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    model = build_model("hf-causal-lm", DataInfo("tokens", (8,), 100),
                        n_layer=1, n_embd=32, n_head=2, bos_token_id=None, eos_token_id=None)
    x = torch.randint(0, 100, (2, 8))
    explained = torch._dynamo.explain(lambda batch: model(**batch).loss)({"input_ids": x, "labels": x})
    assert explained.graph_break_count == 0 and explained.graph_count == 1


@pytest.mark.parametrize("options, said", [
    ({"n_layers": 1}, "hf-causal-lm: GPT2Config has no option 'n_layers' (did you mean 'n_layer'?)"),
    ({"n_layer": "1"}, "hf-causal-lm: Validation error for field 'n_layer': TypeError: Field 'n_layer' expected int, "
                       "got str (value: '1')")])
def test_a_hugging_face_option_misspelled_or_of_the_wrong_type_is_one_line(options, said):
    """A config keeps any keyword it does not know: 'n_layers' built the default 12 layers without a word."""
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    with pytest.raises(ValueError) as refused:
        build_model("hf-causal-lm", DataInfo("tokens", (8,), 100), n_embd=32, n_head=2, **options)
    assert str(refused.value) == said
    model = build_model("hf-causal-lm", DataInfo("tokens", (8,), 100), n_layer=1, n_embd=32, n_head=2,
                        attn_implementation="sdpa", bos_token_id=None, eos_token_id=None)    # transformers' own keyword
    assert len(model.transformer.h) == 1
