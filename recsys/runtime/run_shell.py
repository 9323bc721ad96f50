"""The run shell: the choreography every entry point's run goes through (main.py and so dlrm.py and
dcnv2.py, wide_and_deep/main.py), written once so the entry points cannot drift apart.

Around the entry point's job it
  - sets TF_ENABLE_ONEDNN_OPTS before TensorFlow's first import, as measured for this CPU's kind
    (cpu_settings.py; a value the user set wins), and rank 0 prints the choice,
  - binds the rank to its CPUs by the entry point's --affinity (cpu_affinity.py; DLRM's `auto`
    gives each of several ranks on a host its own share of the cores) once Horovod says how many
    ranks share the host, and every rank prints its CPUs,
  - sets TensorFlow's inter- and intra-op thread counts after the binding and before any op runs (a peer watch's first collective starts TensorFlow's runtime): the
    entry point's counts where given; on a CPU run the rest as measured for this CPU's kind
    (cpu_settings.thread_choice), which rank 0 prints,
  - installs the stop-signal handlers for the run and ignores further signals after it; a StopNow
    (a signal outside graceful training) is its one line and exit code 128+N,
  - starts Horovod (distributed.init) and the dllogger (rank 0 writes), closed at the end,
  - with peers, starts the peer watch (peer_watch.py; DLRM_PEER_TIMEOUT read here, once): a rank
    killed, frozen or cut off ends every other rank with one `error: lost rank ...` line and exit 1
    instead of a hang; a rank leaving through the shell says "done" first, one whose job crashed
    does not (its peers must not wait for it),
  - checks the outputs and takes the save folder's lock on rank 0 (Session.claim_outputs), removing
    the temporaries a run that ended mid-save left there, with the verdict agreed on every rank:
    refused, every rank says why and waits for the others before it exits (a launcher kills the
    other ranks at the first exit); a dead run's lock is taken over with a message,
  - maps the entry point's bad-input errors to one `error:` line and exit 2 (cli.py's convention),
  - gives the lock back at the end, however the run ends; after a graceful stop (exit 128 + N on
    every rank) the ranks leave together, once rank 0 has closed its logger and given the lock back.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Tuple, Type


# How long a rank whose job failed waits for the peer watch to name a lost peer (a killed peer's
# connection closes at once) before its own traceback.
LOSS_GRACE_S = 3.0


class OutputsRefused(Exception):
    """Rank 0 refused an output or the save folder's lock; raised on every rank with its message."""


@dataclass(frozen=True)
class ShellConfig:
    """What the shell needs from an entry point, as plain values.

    `log_path`: the dllogger file (rank 0 writes it; empty or None: stdout only).
    `user_errors`: returns the exception types caused by bad input (reported as one line, exit 2);
    a function, because importing them imports TensorFlow, which must wait for the environment.
    `inter_op_threads`, `intra_op_threads`: the user's thread counts (None or 0: not given; the
    entry point checks their values); `cpu`: the run computes on the CPU even where a GPU is seen;
    `affinity`: the --affinity mode (cpu_affinity.MODES or AUTO) this rank is bound by.
    """
    log_path: Optional[str]
    user_errors: Callable[[], Tuple[Type[BaseException], ...]] = lambda: ()
    inter_op_threads: Optional[int] = None
    intra_op_threads: Optional[int] = None
    cpu: bool = False
    affinity: str = "disabled"


@dataclass
class Session:
    """The run's place in the job and its logger, handed to the entry point's job."""
    rank: int
    world_size: int
    local_rank: int
    local_size: int
    logger: Any  # logger.DllLogger
    lock: Any = field(default=None)  # folder_lock.FolderLock held by rank 0, released by the shell

    def claim_outputs(self, check: Callable[[], None], save_folder: Optional[str] = None,
                      save_flag: str = "") -> None:
        """Rank 0 runs `check` (raises OutputPathError naming the flag) and then holds `save_folder`
        (named `save_flag` in messages) for the run's lifetime; every rank gets the verdict, so a
        refusal stops the whole job with one message instead of leaving ranks in a collective.
        Raises OutputsRefused on every rank when refused."""
        from recsys.runtime import distributed as dist
        from recsys.runtime import folder_lock
        from recsys.runtime.logger import print_rank0
        from recsys.runtime.safe_io import OutputPathError, remove_foreign_temporaries

        removed = []

        def check_and_hold() -> None:
            check()
            if save_folder:
                self.lock = folder_lock.acquire(save_folder, save_flag)
                removed.extend(remove_foreign_temporaries(save_folder))  # ours alone now: any other is stale

        message = dist.rank0_verdict(self.rank, check_and_hold, (OutputPathError, folder_lock.FolderLockedError))
        if message:
            raise OutputsRefused(message)
        if self.lock is not None and self.lock.took_over is not None:
            print_rank0(f"{save_flag} {save_folder} was held by a run that ended without giving it back "
                        f"({self.lock.took_over.describe()}); taking it over", rank=self.rank)
        if removed:
            print_rank0(f"{save_flag}: removed what a run that ended mid-write left half-written: "
                        f"{', '.join(os.path.basename(path) for path in removed)}", rank=self.rank)


def run(config: ShellConfig, job: Callable[[Session], int]) -> int:
    """Run `job` inside the shell (this module's docstring); returns the exit code for sys.exit."""
    from recsys.runtime.stop_signals import STOP, StopNow

    STOP.install()
    try:
        return _run(config, job)
    except StopNow as stop:
        return stop.report()
    finally:
        STOP.ignore_further()


def set_thread_counts(config: ShellConfig, ranks_on_host: int) -> Optional[str]:
    """TensorFlow's inter- and intra-op thread counts, before its runtime starts: the given ones (a
    count below 1 is left for the entry point's flag check to name); on a CPU run the rest as
    cpu_settings.thread_choice measured them, with the start-up line that says so (None on a GPU
    run, which keeps TensorFlow's defaults for what is not given)."""
    import tensorflow as tf

    from recsys.runtime.cpu_settings import host_thread_choice

    inter, intra = ((count if count and count > 0 else None) for count in (config.inter_op_threads,
                                                                          config.intra_op_threads))
    line = None
    if config.cpu or not tf.config.list_physical_devices("GPU"):
        choice = host_thread_choice(ranks_on_host, inter, intra)
        inter, intra, line = choice.inter, choice.intra, choice.line
    if inter:
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    if intra:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
    return line


def _run(config: ShellConfig, job: Callable[[Session], int]) -> int:
    from recsys.runtime.cpu_settings import apply_onednn_choice
    cpu_line = apply_onednn_choice()  # before the first TensorFlow import (just below)
    from recsys.runtime import distributed as dist
    from recsys.runtime import peer_watch
    from recsys.runtime.cli import bad_input, failure

    try:
        peer_timeout_s = peer_watch.timeout_from_environment()
    except ValueError as error:
        return bad_input(error)
    from recsys.runtime.logger import DllLogger, print_rank0

    dist.init()
    from recsys.runtime.cpu_affinity import apply_affinity
    # every rank says its CPUs, in one write (print() writes the newline apart, and the launcher can
    # put another rank's line between the two); before the thread counts, which count the CPUs bound
    sys.stdout.write(apply_affinity(config.affinity, dist.local_rank(), dist.local_size()) + "\n")
    sys.stdout.flush()
    thread_line = set_thread_counts(config, dist.local_size())
    print_rank0(cpu_line, rank=dist.rank())
    if thread_line:
        print_rank0(thread_line, rank=dist.rank())
    session = Session(dist.rank(), dist.size(), dist.local_rank(), dist.local_size(),
                      DllLogger(config.log_path, enabled=dist.rank() == 0))  # the file opens at its first record
    watch, crashed, stopped_together = None, False, False
    try:
        if session.world_size > 1 and peer_timeout_s > 0:
            try:
                watch = peer_watch.start(session.rank, peer_timeout_s, dist.allgather_object, session.logger.flush)
            except peer_watch.PeerWatchError as error:
                return failure(error)
        try:
            code = job(session)
            stopped_together = code >= 128 and session.world_size > 1  # a graceful stop, agreed on every rank
            return code
        except OutputsRefused as refused:
            code = bad_input(refused)
            dist.barrier()  # every rank has said why before any exits: a launcher kills the rest at the first exit
            return code
        except config.user_errors() as error:
            return bad_input(error)
        except Exception:
            crashed = True
            if watch is not None and watch.wait_for_loss(LOSS_GRACE_S):
                # a peer's death also fails the collective this rank was in: its line, not this
                # traceback. The watch is flushing the logs and ending the process: wait for it (stop
                # blocks while it ends), or the traceback would print beside its line meanwhile.
                watch.stop()
            raise
    finally:
        session.logger.close()
        if session.lock is not None:
            session.lock.release()
        if stopped_together:
            # rank 0 has more to do after the checkpoint (its logger, the lock): a launcher kills the
            # other ranks at the first non-zero exit, so no rank leaves before rank 0 has done it
            dist.barrier()
        if watch is not None and not crashed:
            watch.stop()
