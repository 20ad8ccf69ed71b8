"""What happens to a run when its capacity goes away: spot preemptions, requeues and the fallback to on-demand.

`preemption.py` counts what preemptions cost a run (from its event log) and decides what to do about the next one:
resume, fall back to on-demand, or give up. `requeue.py` acts for a job the engine keeps through a preemption (a
requeued Slurm job, a Job Kueue evicted) while it waits: it moves the job to on-demand capacity when the policy says
so, and releases Slurm's requeue hold when the last attempt checkpointed cleanly.
"""
