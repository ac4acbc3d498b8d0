"""Stand-in for ROLL's ``register``: marks a worker method the driver may call."""

import functools

FLAG = "worker_method_attrs"


def register(dispatch_mode="all_to_all", **options):
    def decorator(func):
        @functools.wraps(func)
        def inner(*args, **kwargs):
            return func(*args, **kwargs)

        setattr(inner, FLAG, {"dispatch_mode": dispatch_mode, **options})
        return inner

    return decorator
