"""The process and its machine: runtime (device, seeds, precision), memory, cores, signals, files
written whole, and the metrics sinks."""
