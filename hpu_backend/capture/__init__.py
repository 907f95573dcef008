"""Every way a graph arrives: AOTAutograd's decomposition table for the HPU op set, torch.export, and the
meta-device trace of capacity planning; each hands an aten FX graph to ``lowering.lower``."""
