"""The drill's load generator, taken from the source checkout: the wheel does not ship it.

The client side of ``tileship drill`` (KServe v2 requests from worker threads, every answer
checked and recorded) is test and benchmark tooling, ``benchmarks/drill_client.py``. Importing
this module imports that one through ``tileship.extras.drill_client`` and re-exports what the
drill uses; where it cannot be found (an installed wheel) it raises ``MissingExtra`` naming the
file and how to get it. ``tileship.verify.drill`` imports it, and the CLI imports the drill only
when the command runs, so nothing else depends on the checkout.
"""

from __future__ import annotations

from tileship.extras import drill_client

_client = drill_client()
Record = _client.Record
Sample = _client.Sample
encode_request = _client.encode_request
run_client = _client.run_client

__all__ = ["Record", "Sample", "encode_request", "run_client"]
