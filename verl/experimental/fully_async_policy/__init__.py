"""verl's fully async entry point (``python -m verl.experimental.fully_async_policy.fully_async_main``)."""
