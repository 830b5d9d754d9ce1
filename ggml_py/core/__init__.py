"""The runtime: types, tensors, ops, graphs, task profiles and the planner, over the C core (_core)."""
