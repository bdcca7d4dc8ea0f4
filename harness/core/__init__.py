"""What every part of the harness shares and none owns: the bottom layer, below the zoo, sweep, diagnose, ci
and upstream (tests/test_layers.py holds the order)."""
