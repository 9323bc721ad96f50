"""The run's foundation, the same for every model: the command-line and exit-code convention, stop
signals, the output-folder lock, safe writes, collectives over Horovod, precision, CPU affinity, the
compiled op package, the dllogger-format logger and step timer, TensorBoard scalars and metrics."""
