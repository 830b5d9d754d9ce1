"""Tensor-parallel inference over MPI: a llama model split across processes (ranks), rank 0
scheduling and sampling, the others computing their share of each step
(docs/distributed.md). Nothing here imports mpi4py until a communicator is asked for."""
