"""Tests of data_prep: loaders, preprocessing, partitioning, the shard format and the CLI."""
