import os
import warnings

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
warnings.filterwarnings("ignore", message=".*torchvision.*")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """Saves a tiny model once per session: model_dir(case_name) -> directory (see _hf_tiny.AUTO_CASES)."""
    import _hf_tiny

    made: dict[str, object] = {}

    def get(case: str):
        if case not in made:
            auto, config, _, _ = _hf_tiny.AUTO_CASES[case]
            made[case] = _hf_tiny.save_tiny(auto, config(), tmp_path_factory.mktemp(case))
        return made[case]

    return get
