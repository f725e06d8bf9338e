"""The actor's training side: the role-neutral update loop, the TrainingBackend contract, and the dp, fsdp2 and
megatron backends. Import the modules themselves (``verl.workers.actor.update_loop``, ...); this package exports
nothing so that importing one backend never pulls in another backend's dependencies (megatron-core, FSDP2).
"""
