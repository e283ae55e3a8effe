"""Supervision: a set of duties, one module each, each with a `run_once(session)` over a batch of jobs.

    launch_attempts        launch the current attempt of new and restarted jobs (tearing the one
                           it replaces down first)
    reconcile_attempts     read each launched attempt's status from its backend, record what the
                           backend saw, and end the attempt when it is over
    detect_silent_ranks    hang_detected for ranks past their heartbeat timeout (database only)
    detect_stragglers      straggler_detected / straggler_cleared once per episode, and the exclude
                           action (database only)
    detect_restart_anomalies  restart storms, stalled progress, stuck recoveries (database only)
    time_out_pending       give up on attempts that never started running within the spec's timeout
    cancel_jobs            tear down jobs whose cancellation was asked for
    release_finished_jobs  free what an ended job leaves behind (processes, pods, Secrets, tokens)

Every decision goes through `api.services.lifecycle`; a duty only reads, asks, and carries out.
Each duty is its own Celery beat task (workers/tasks/duties.py), so a slow backend holds up only
the duty, and within reconcile only the job, that waits on it.
"""
