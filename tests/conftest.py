"""Fixtures shared by the test modules; their helpers live in tests/helpers/."""
import pytest

from tests.helpers.data_files import make_image_folder, make_token_files


@pytest.fixture(scope="session")
def images(tmp_path_factory):
    """3 classes of 8 training and 2 validation JPEGs (tests that break files work on a copy)."""
    return make_image_folder(tmp_path_factory.mktemp("images"), classes=3, per_class=8, val_per_class=2)


@pytest.fixture(scope="session")
def tokens(tmp_path_factory):
    """train.bin of 12,000 and val.bin of 2,000 uint16 tokens below 64."""
    return make_token_files(tmp_path_factory.mktemp("tokens"), train_tokens=12_000, val_tokens=2_000, vocab=64)
