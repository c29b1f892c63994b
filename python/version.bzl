# The package's version for the Bazel wheel's file name; it must equal
# knapformer/_version.py's (python/make_wheel.py refuses otherwise).
VERSION = "0.1.0"
