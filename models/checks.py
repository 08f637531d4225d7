"""Input checks shared by model factories, so a model/dataset mismatch fails with a clear message."""


def expect_kind(info, model: str, kind: str) -> None:
    """Raise if `info` (a datasets.DataInfo) is not the data kind `model` was written for."""
    if info.kind != kind:
        raise ValueError(
            f"--model {model} needs {kind} data but the dataset (--dataset) is {info.kind} data "
            f"with input shape {info.input_shape}; pick a --model made for {info.kind} data or a --dataset of "
            f"{kind} data"
        )
