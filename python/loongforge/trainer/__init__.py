"""The trainer, ``python -m loongforge.trainer`` (also ``python -m loongforge.train``).

    cli.py         the flags, their checks and ``main`` (exit statuses)
    plan.py        what a run will do, decided before it is built
    session.py     ``build``: the parts of a run put together in a ``Session``
    loop.py        ``train_loop``, ``run``, ``resume`` and ``StopSignal``
    errors.py      ``TrainError`` and ``NonFiniteError``
    dist.py        rank, world size, device and the process group
    optim.py       AdamW, its schedule and the step that skips non-finite steps
    checkpoint.py  ``Checkpointer`` and the RNG states a checkpoint holds
    inputs.py      each mode's loader and the token guard
    model.py       the policy from its config and a seed
    compile.py     torch.compile of the frozen path and of the dense blocks

The gradient sync (``SyncBackend``) lives in loongforge/comm.py beside NexusSync, and the run's
MemSculptor (``MemSculptorSession``) in loongforge/memory.py beside MemSculptor. Importing this package
imports none of its modules.
"""
