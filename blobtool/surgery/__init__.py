"""Changing a net: weights into a net, BatchNorm folded, layers renamed and dropped."""
