"""The suite's markers. Bazel runs every test on the host's torch (1.13);
tests/python/pip_install_check.sh runs the suite again on torch 2.6 (CI's
trixie lane) but for the tests marked torch_independent: what they prove
(the planner's arithmetic, a command line's checks, a picture) does not
depend on the torch release, so each proof runs once."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "torch_independent: proves nothing that depends on the torch release; "
        "the torch 2.x run of the suite (pip_install_check.sh --suite) leaves it out")
