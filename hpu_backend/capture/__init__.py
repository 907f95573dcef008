"""Every way a graph arrives: AOTAutograd's decomposition table for the HPU op set, and torch.export."""
