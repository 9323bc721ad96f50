"""Shared pytest setup: the repo root is importable and TF runs deterministically and quietly."""
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_DETERMINISTIC_OPS", "1")
# The allocator-statistics tests read TensorFlow's CPU allocator peaks, which exist only for its BFC
# allocator: the default on AVX-512 CPUs (oneDNN on), not on AVX2-only ones. Chosen explicitly, every
# CPU kind runs them the same way.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

# Tests send SIGTERM, SIGINT, SIGUSR1 and SIGHUP to the scripts they start, as a terminal or a scheduler
# would. Those signals can be ignored (or blocked) in this process: a harness may start the suite so, and an entry
# point run in-process ignores the stop signals once it has finished (stop_signals.ignore_further). Every
# child inherits that, and bash can neither trap nor reset a signal ignored when it started: a demo would
# then run on unstopped. Each test starts with the dispositions a terminal gives.
import signal  # noqa: E402

import pytest  # noqa: E402

_TERMINAL_DISPOSITIONS = ((signal.SIGTERM, signal.SIG_DFL), (signal.SIGHUP, signal.SIG_DFL),
                          (signal.SIGUSR1, signal.SIG_DFL), (signal.SIGINT, signal.default_int_handler))


@pytest.fixture(autouse=True)
def terminal_signal_dispositions():
    """Before each test: the stop signals handled as from a terminal where something left them ignored."""
    for number, default in _TERMINAL_DISPOSITIONS:
        if signal.getsignal(number) == signal.SIG_IGN:
            signal.signal(number, default)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [number for number, _ in _TERMINAL_DISPOSITIONS])  # a blocked one too
    yield


@pytest.fixture(scope="session")
def cluster_session():
    """One cluster of 3 hosts (tests/cluster.py) for the whole session: `up` costs seconds; down at the end."""
    from cluster import Cluster, require_cluster

    require_cluster()
    made = Cluster(nodes=3)
    made.up()
    yield made
    made.down()


@pytest.fixture
def cluster(cluster_session):
    """The session's cluster, whole (up again after a test that broke or removed it), every link up and
    unlimited after the test."""
    cluster_session.up()
    yield cluster_session
    cluster_session.reset()
