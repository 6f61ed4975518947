"""mpifc.runtime"""
