"""mpifc.experiments"""
