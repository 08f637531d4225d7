"""Locating downloaded dataset files, with errors that say where to get them."""

from pathlib import Path

DEFAULT_DATA_DIR = "data"


def find_file(data_dir: str | None, candidates: list[str], dataset: str, source: str) -> Path:
    """Return the first existing candidate (paths relative to data_dir).

    Real datasets are never downloaded implicitly: the training machines may
    have no network, so a missing file must tell the user how to fix it.
    """
    root = Path(data_dir or DEFAULT_DATA_DIR)
    for candidate in candidates:
        path = root / candidate
        if path.is_file():
            return path
    tried = ", ".join(candidates)
    raise FileNotFoundError(
        f"{dataset} file '{candidates[0]}' not found in '{root.resolve()}' (tried {tried}); "
        f"download it from {source} and put it in that directory, or pass the data_dir that holds it"
    )
