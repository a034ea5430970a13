"""Side-by-side benchmarks of rl_data against the data loaders a user would otherwise pick."""
