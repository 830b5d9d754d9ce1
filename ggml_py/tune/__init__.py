"""mulmat-tune: benching MUL_MAT profiles per shape, M and thread count, and the tune files that hold the times."""
