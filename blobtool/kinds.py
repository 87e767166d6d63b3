"""The kinds of file blobtool reads (no imports: the command line builds its options from these)."""

# Every kind --kind accepts, and the ones that hold several named blobs.
KINDS = ("blob", "vector", "net", "solverstate", "npy", "npz")
CONTAINER_KINDS = ("vector", "net", "solverstate")
