"""mpifc.ngm"""
