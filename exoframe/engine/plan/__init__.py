"""What is decided before any process starts: the Job resolved from a RunConfig, each node's
device and worker (the Placement), memory and FLOP estimates, the stop rule of a target."""
