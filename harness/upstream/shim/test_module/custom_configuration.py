"""Stand-in for a Transformers checkout's `utils/test_module/custom_configuration.py`, put on the path only
when the checkout has no `utils/` (a bare `tests/` folder): `tests/utils/test_configuration_utils.py`
imports it at module level, and every model test imports that module for `config_common_kwargs`. The
class is used only by the configuration tests, which this harness does not run."""

from transformers import PretrainedConfig


class CustomConfig(PretrainedConfig):
    model_type = "custom"

    def __init__(self, attribute: int = 1, **kwargs: object) -> None:
        self.attribute = attribute
        super().__init__(**kwargs)
