"""mpifc.analysis"""
