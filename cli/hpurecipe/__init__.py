"""hpurecipe: the command line that prebuilds, warms, inspects, evicts, verifies and ships the recipe cache."""
