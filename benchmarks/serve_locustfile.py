"""The locust users of ``benchmarks.serve_load``: each posts one reverse-a-word prompt to
``/generate`` (greedy, at most 6 new tokens, as the demo's rollout), then the next as soon as
the answer is in (a closed loop: N users keep at most N requests in flight). Run by locust
itself (``locust -f benchmarks/serve_locustfile.py --headless ...``), never imported."""

from __future__ import annotations

import itertools
import random

from locust import HttpUser, constant, task

LETTERS = "abcde"  # the demo task's alphabet (trainer/configs/demo.yaml: letters 5)
PROMPTS = ["".join(w) + ">" for n in (2, 3, 4) for w in itertools.product(LETTERS, repeat=n)]


class PolicyUser(HttpUser):
    """One client of the policy server."""

    wait_time = constant(0)

    @task
    def generate(self) -> None:
        body = {"prompt": random.choice(PROMPTS), "max_new_tokens": 6, "temperature": 0}
        with self.client.post("/generate", json=body, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
