"""The signal guard of training (g2rpo.training.preemption) and the hold fail point, in this process:
what a signal does in each phase, what it prints, and that the previous handlers come back."""

from __future__ import annotations

import os
import signal
import threading
import time

from g2rpo.training.failpoints import hold
from g2rpo.training.preemption import StopOnSignal, exit_status


def test_a_signal_while_training_is_recorded_and_announced_as_a_stop(capsys):
    before = signal.getsignal(signal.SIGTERM)
    with StopOnSignal(30) as stop:
        assert not stop.received
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs at the next bytecode of the main thread
        assert stop.received and stop.signum == signal.SIGTERM
        assert stop._timer is not None and stop._timer.is_alive()  # the grace period runs
    assert stop._timer is None  # leaving the guard ends the grace period
    assert signal.getsignal(signal.SIGTERM) is before
    err = capsys.readouterr().err
    assert (
        "SIGTERM received: finishing this iteration, then writing a checkpoint (within train.stop_grace_s = 30 s)"
        in err
    )


def test_after_the_last_iteration_a_signal_lets_the_final_checkpoint_and_export_finish(capsys):
    with StopOnSignal(30) as stop:
        stop.finishing()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.received and stop.signum == signal.SIGINT
    err = capsys.readouterr().err
    assert "SIGINT received: the last iteration is done: finishing the final checkpoint and the export" in err
    assert "finishing this iteration" not in err


def test_other_ranks_stay_quiet_and_exit_status_is_128_plus_the_signal(capsys):
    with StopOnSignal(30, announce=False) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert stop.received
    assert capsys.readouterr().err == ""
    assert exit_status(signal.SIGTERM) == 143 and exit_status(signal.SIGINT) == 130


def test_hold_waits_for_the_signal_and_gives_up_at_its_limit(capsys):
    flag = threading.Event()
    threading.Timer(0.3, flag.set).start()
    started = time.monotonic()
    assert hold(2, flag.is_set, limit_s=30) is True
    assert 0.25 < time.monotonic() - started < 5
    assert "holding in iteration 2 until a signal (at most 30 s)" in capsys.readouterr().err
    started = time.monotonic()
    assert hold(3, lambda: False, limit_s=0.3) is False
    assert time.monotonic() - started >= 0.3
