"""data_prep: datasets into per-client HDF5 shards (python -m data_prep)."""
