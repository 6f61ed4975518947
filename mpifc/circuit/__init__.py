"""mpifc.circuit"""
