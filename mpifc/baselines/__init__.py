"""mpifc.baselines"""
