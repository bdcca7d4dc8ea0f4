"""hf-tpu's harness: the model zoo, the sweep, expected results and the dashboard."""
