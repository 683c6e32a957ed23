"""One module per kernel: config, CuTe-DSL kernel, torch op, reference, check and bench."""
