# The package's version, in one place: the pip build, the Bazel wheel
# (python/version.bzl must agree; make_wheel.py checks) and __version__.
__version__ = "0.1.0"
