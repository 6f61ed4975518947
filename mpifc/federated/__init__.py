"""mpifc.federated"""
