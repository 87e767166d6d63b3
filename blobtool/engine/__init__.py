"""The engine: Caffe's Blob and SyncedMemory in Python, the host kernels, and the work settings a call carries.

It imports nothing from the layers above it (formats, the command line):
what a call needs from them (where a mapped input's pages are, its
progress display) comes in through blobtool.engine.work.
"""
